//! `WWW-Authenticate` parsing (RFC 7235), enough for registry Basic and Bearer challenges.

/// One challenge: its scheme (lowercased) and its auth-params (names lowercased).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Challenge {
    pub scheme: String,
    pub params: Vec<(String, String)>,
}

impl Challenge {
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Where and for which service to fetch a registry token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BearerChallenge {
    pub realm: String,
    pub service: Option<String>,
}

/// The first Bearer challenge with a realm, if the header holds one.
pub(crate) fn bearer_challenge(header: &str) -> Option<BearerChallenge> {
    parse(header)
        .into_iter()
        .filter(|c| c.scheme == "bearer")
        .find_map(|c| {
            let realm = c.param("realm")?.to_string();
            Some(BearerChallenge {
                realm,
                service: c.param("service").map(str::to_string),
            })
        })
}

/// Parses every challenge in a header value; tolerant of odd spacing and unknown params.
pub(crate) fn parse(header: &str) -> Vec<Challenge> {
    let chars: Vec<char> = header.chars().collect();
    let mut pos = 0;
    let mut challenges: Vec<Challenge> = Vec::new();
    loop {
        while pos < chars.len() && (chars[pos].is_whitespace() || chars[pos] == ',') {
            pos += 1;
        }
        if pos >= chars.len() {
            break;
        }
        let token = read_token(&chars, &mut pos);
        let mut look = pos;
        while look < chars.len() && chars[look].is_whitespace() {
            look += 1;
        }
        if look < chars.len() && chars[look] == '=' {
            pos = look + 1;
            while pos < chars.len() && chars[pos].is_whitespace() {
                pos += 1;
            }
            let value = if pos < chars.len() && chars[pos] == '"' {
                read_quoted(&chars, &mut pos)
            } else {
                read_token(&chars, &mut pos)
            };
            // A param before any scheme belongs to nothing; drop it.
            if let Some(current) = challenges.last_mut() {
                current.params.push((token.to_ascii_lowercase(), value));
            }
        } else if token.is_empty() {
            // A stray character we cannot read; step over it rather than loop forever.
            pos += 1;
        } else {
            challenges.push(Challenge {
                scheme: token.to_ascii_lowercase(),
                params: Vec::new(),
            });
        }
    }
    challenges
}

fn read_token(chars: &[char], pos: &mut usize) -> String {
    let start = *pos;
    while *pos < chars.len()
        && !chars[*pos].is_whitespace()
        && !matches!(chars[*pos], ',' | '=' | '"')
    {
        *pos += 1;
    }
    chars[start..*pos].iter().collect()
}

/// Reads a quoted-string starting at the opening quote; backslash escapes the next char.
fn read_quoted(chars: &[char], pos: &mut usize) -> String {
    let mut out = String::new();
    *pos += 1;
    while *pos < chars.len() {
        match chars[*pos] {
            '"' => {
                *pos += 1;
                break;
            }
            '\\' if *pos + 1 < chars.len() => {
                out.push(chars[*pos + 1]);
                *pos += 2;
            }
            c => {
                out.push(c);
                *pos += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_distribution_bearer_challenge() {
        let h = r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:snap/vm:pull""#;
        let c = bearer_challenge(h).unwrap();
        assert_eq!(c.realm, "https://auth.example.com/token");
        assert_eq!(c.service.as_deref(), Some("registry.example.com"));
        let all = parse(h);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].param("scope"), Some("repository:snap/vm:pull"));
    }

    #[test]
    fn parses_basic_and_multiple_challenges_and_odd_spacing() {
        let all = parse(r#"Basic realm="test""#);
        assert_eq!(all[0].scheme, "basic");
        assert_eq!(all[0].param("realm"), Some("test"));
        assert!(bearer_challenge(r#"Basic realm="test""#).is_none());

        let h = r#"Basic realm="a, b", BEARER Realm = "https://t/x" , service=reg.local, error="invalid_token""#;
        let all = parse(h);
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[0].param("realm"), Some("a, b"));
        let c = bearer_challenge(h).unwrap();
        assert_eq!(c.realm, "https://t/x");
        assert_eq!(c.service.as_deref(), Some("reg.local"));
    }

    #[test]
    fn tolerates_escapes_garbage_and_missing_realm() {
        let all = parse(r#"Bearer realm="q\"uote""#);
        assert_eq!(all[0].param("realm"), Some("q\"uote"));
        assert!(bearer_challenge("Bearer service=x").is_none());
        assert!(bearer_challenge("").is_none());
        assert!(bearer_challenge(r#"=,,"unterminated"#).is_none());
        assert!(parse("\"\"\"===").is_empty());
    }
}
