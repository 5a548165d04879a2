//! Token auth: a signer of the JWTs Distribution verifies, and a tiny token server.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub(super) const ISSUER: &str = "registry-test-issuer";
pub(super) const SERVICE: &str = "registry-test";

/// Signs ES256 JWTs the way Distribution's token auth verifies them: an `x5c` header
/// whose certificate chains to `rootcertbundle`.
pub(super) struct TokenSigner {
    key: rcgen::KeyPair,
    x5c: String,
}

impl TokenSigner {
    /// A token granting every action of `scope` ("repository:<name>:<a,b>"), or none.
    pub(super) fn token(&self, scope: &str) -> String {
        use base64::Engine as _;
        use rcgen::SigningKey as _;
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let access: Vec<serde_json::Value> = scope
            .split(' ')
            .filter_map(|s| {
                let (kind, rest) = s.split_once(':')?;
                let (name, actions) = rest.rsplit_once(':')?;
                Some(serde_json::json!({
                    "type": kind, "name": name, "actions": actions.split(',').collect::<Vec<_>>()
                }))
            })
            .collect();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs();
        let header = serde_json::json!({ "typ": "JWT", "alg": "ES256", "x5c": [self.x5c] });
        let claims = serde_json::json!({
            "iss": ISSUER, "sub": "test", "aud": SERVICE,
            "exp": now + 300, "nbf": now - 60, "iat": now,
            "jti": format!("{now}-{}", access.len()), "access": access,
        });
        let signing_input = format!(
            "{}.{}",
            url.encode(header.to_string()),
            url.encode(claims.to_string())
        );
        let der = self.key.sign(signing_input.as_bytes()).expect("sign token");
        format!("{signing_input}.{}", url.encode(ecdsa_der_to_raw(&der)))
    }
}

/// JWS wants r||s (32 bytes each); ring signs ASN.1 `SEQUENCE { INTEGER r, INTEGER s }`.
fn ecdsa_der_to_raw(der: &[u8]) -> Vec<u8> {
    fn integer(der: &[u8], at: &mut usize) -> Vec<u8> {
        assert_eq!(der[*at], 0x02, "ASN.1 INTEGER expected");
        let len = der[*at + 1] as usize;
        let value = &der[*at + 2..*at + 2 + len];
        *at += 2 + len;
        let value: Vec<u8> = value.iter().copied().skip_while(|b| *b == 0).collect();
        let mut out = vec![0u8; 32 - value.len()];
        out.extend(value);
        out
    }
    assert_eq!(der[0], 0x30, "ASN.1 SEQUENCE expected");
    let mut at = 2;
    let mut raw = integer(der, &mut at);
    raw.extend(integer(der, &mut at));
    raw
}

/// A minimal Docker token server on a loopback thread: `GET /token?scope=..` with the
/// right basic credentials gets a JWT for that scope, anything else a 401.
pub(super) struct TokenServer {
    pub(super) port: u16,
    pub(super) signer: Arc<TokenSigner>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TokenServer {
    pub(super) fn start(dir: &Path, credentials: (String, String)) -> Self {
        use base64::Engine as _;
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let key = KeyPair::generate().expect("token key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("token params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "registry test token signer");
        let cert = params.self_signed(&key).expect("token certificate");
        std::fs::write(dir.join("token-ca.pem"), cert.pem()).expect("write token-ca.pem");
        let signer = Arc::new(TokenSigner {
            x5c: base64::engine::general_purpose::STANDARD.encode(cert.der()),
            key,
        });

        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind token server");
        let port = listener.local_addr().expect("token server address").port();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", credentials.0, credentials.1))
        );
        let thread = {
            let (signer, stop) = (signer.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(stream) = stream {
                        let _ = serve_token(stream, &signer, &expected);
                    }
                }
            })
        };
        Self {
            port,
            signer,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wake the blocking accept so the thread sees the flag.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve_token(
    mut stream: TcpStream,
    signer: &TokenSigner,
    expected_auth: &str,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 2048];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buf[..n]);
    }
    let request = String::from_utf8_lossy(&request);
    let target = request.split(' ').nth(1).unwrap_or("/");
    let url = reqwest::Url::parse(&format!("http://token{target}")).expect("request target");
    let authorized = request.lines().any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case("authorization") && value.trim() == expected_auth
        })
    });
    let (status, body) = if url.path() != "/token" {
        ("404 Not Found", "{}".to_string())
    } else if !authorized {
        (
            "401 Unauthorized",
            r#"{"details":"bad credentials"}"#.to_string(),
        )
    } else {
        let scopes: Vec<String> = url
            .query_pairs()
            .filter(|(k, _)| k == "scope")
            .map(|(_, v)| v.into_owned())
            .collect();
        let token = signer.token(&scopes.join(" "));
        (
            "200 OK",
            serde_json::json!({ "token": token, "access_token": token, "expires_in": 300 })
                .to_string(),
        )
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}
