use super::*;

fn url(s: &str) -> Url {
    Url::parse(s).unwrap()
}

#[test]
fn link_headers_name_the_next_page() {
    assert_eq!(
        next_link(r#"</v2/vm/tags/list?n=100&last=t099>; rel="next""#).as_deref(),
        Some("/v2/vm/tags/list?n=100&last=t099")
    );
    assert_eq!(
        next_link(r#"<https://a/prev>; rel=prev, <https://a/next>; rel=next"#).as_deref(),
        Some("https://a/next")
    );
    assert_eq!(next_link(r#"<x>; REL="first next""#).as_deref(), Some("x"));
    assert_eq!(next_link(r#"</x>; rel="prev""#), None);
    assert_eq!(next_link(""), None);
    assert_eq!(next_link("<unterminated"), None);
}

/// G1/S5: the listing ends only when the registry says so or cannot have more; each
/// page is asked for once.
#[test]
fn g1_tag_pages_end_without_an_extra_request() {
    let first = url("http://r:5000/v2/vm/tags/list?n=100");
    // The usual answer: one short page, no Link.
    assert_eq!(next_page(&first, None, 1, 1, Some("hibernate")), Ok(None));
    // Distribution 2.x ignores `n` and sends everything.
    assert_eq!(next_page(&first, None, 131, 131, Some("t9")), Ok(None));
    assert_eq!(next_page(&first, None, 0, 0, None), Ok(None));
    // Exactly a full page without Link: ask on, once.
    let next = next_page(&first, None, 100, 100, Some("t099"))
        .unwrap()
        .unwrap();
    assert_eq!(
        next.as_str(),
        "http://r:5000/v2/vm/tags/list?n=100&last=t099"
    );
    // ... and a full page that brought nothing new ends it.
    assert_eq!(next_page(&next, None, 100, 0, Some("t099")), Ok(None));
    // Link is followed, relative or absolute on the same origin.
    let link = r#"</v2/vm/tags/list?last=t1&n=100>; rel="next""#;
    let linked = next_page(&first, Some(link), 100, 100, Some("t1"))
        .unwrap()
        .unwrap();
    assert_eq!(
        linked.as_str(),
        "http://r:5000/v2/vm/tags/list?last=t1&n=100"
    );
    // Never to another host, never the same page again.
    let evil = r#"<http://evil/v2/vm/tags/list>; rel="next""#;
    assert!(next_page(&first, Some(evil), 100, 100, None).is_err());
    let same = r#"</v2/vm/tags/list?n=100>; rel="next""#;
    assert!(next_page(&first, Some(same), 100, 100, None).is_err());
}

#[test]
fn tags_and_digests_are_checked_before_they_reach_a_url() {
    for good in ["hibernate", "t000", "_x", "v1.2-rc_3", &"a".repeat(128)] {
        assert!(valid_tag(good), "{good}");
    }
    for bad in [
        "",
        ".x",
        "-x",
        "a/b",
        "../x",
        "a?b",
        "a#b",
        "a b",
        "tag-é",
        &"a".repeat(129),
    ] {
        assert!(!valid_tag(bad), "{bad}");
    }
    let valid_digest = |digest: &str| digest.parse::<Digest>().is_ok();
    let sha = "sha256:a66f6444bae425ddb05bd47d1ed7576fcd89634f9c92e131b38dfd2372bbeba1";
    assert!(valid_digest(sha));
    assert!(valid_digest("sha512+b64u:abc-_="));
    for bad in [
        "",
        "sha256",
        "sha256:",
        ":abc",
        "sha256:../../x",
        "SHA256:ab",
        "sha256:a?b",
    ] {
        assert!(!valid_digest(bad), "{bad}");
    }
}

#[test]
fn token_answers_in_docker_and_oauth_shapes() {
    assert_eq!(
        token_from_body(r#"{"token":"a","access_token":"b"}"#).unwrap(),
        "a"
    );
    assert_eq!(token_from_body(r#"{"access_token":"b"}"#).unwrap(), "b");
    let err = token_from_body(r#"{"token":""}"#).unwrap_err();
    assert!(err.to_string().contains("neither"), "{err}");
    assert!(token_from_body("<html>").is_err());
}

#[test]
fn bearer_challenges_give_realm_and_service() {
    let h = r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:snap/vm:pull""#;
    let (realm, service) = bearer_challenge(h).unwrap();
    assert_eq!(realm, "https://auth.example.com/token");
    assert_eq!(service.as_deref(), Some("registry.example.com"));
    let h = r#"Basic realm="a, b", BEARER Realm="https://t/x", service=reg.local"#;
    assert_eq!(
        bearer_challenge(h),
        Some(("https://t/x".into(), Some("reg.local".into())))
    );
    assert_eq!(bearer_challenge(r#"Basic realm="test""#), None);
    assert_eq!(bearer_challenge("Bearer service=x"), None);
    assert_eq!(bearer_challenge(r#"=,,"unterminated"#), None);
}

/// S5: refusals are permanent, throttling and outages transient.
#[test]
fn s5_unexpected_answers_map_to_errors() {
    let e = RegistryError::from_status("resolve", 403, "denied");
    assert!(matches!(e, RegistryError::Unauthorized { status: 403, .. }));
    assert!(e.is_permanent());
    let throttled = r#"{"errors":[{"code":"TOOMANYREQUESTS"}]}"#;
    let e = RegistryError::from_status("list_tags", 400, throttled);
    assert!(matches!(e, RegistryError::Server { status: 429, .. }));
    assert!(!e.is_permanent());
    assert!(!RegistryError::from_status("resolve", 503, "").is_permanent());
    let invalid = r#"{"errors":[{"code":"NAME_INVALID"}]}"#;
    assert!(RegistryError::from_status("x", 400, invalid).is_permanent());
}

#[test]
fn w3_delete_statuses_map_to_outcomes_and_errors() {
    let interpret = |status, body| interpret_delete(status, body, "r", "delete");
    assert!(matches!(interpret(202, ""), Ok(true)));
    assert!(matches!(interpret(200, ""), Ok(true)));
    assert!(matches!(interpret(404, "MANIFEST_UNKNOWN"), Ok(false)));
    let distribution = r#"{"errors":[{"code":"DIGEST_INVALID","message":"provided digest did not match uploaded content"}]}"#;
    assert!(matches!(
        interpret(400, distribution),
        Err(RegistryError::DeleteRefused { status: 400, .. })
    ));
    assert!(matches!(
        interpret(405, r#"{"errors":[{"code":"UNSUPPORTED"}]}"#),
        Err(RegistryError::DeleteRefused { status: 405, .. })
    ));
    assert!(matches!(
        interpret(400, r#"{"errors":[{"code":"NAME_INVALID"}]}"#),
        Err(RegistryError::Server { status: 400, .. })
    ));
    assert!(matches!(
        interpret(403, "denied"),
        Err(RegistryError::Unauthorized { status: 403, .. })
    ));
    assert!(matches!(
        interpret(503, "down"),
        Err(RegistryError::Server { status: 503, .. })
    ));
}

#[test]
fn catalog_pages_end_without_an_extra_request() {
    let first = url("http://r:5000/v2/_catalog?n=100");
    assert_eq!(next_page(&first, None, 3, 3, Some("c")).unwrap(), None);
    assert_eq!(next_page(&first, None, 0, 0, None).unwrap(), None);
    assert_eq!(next_page(&first, None, 250, 250, Some("z")).unwrap(), None);
    let next = next_page(&first, None, 100, 100, Some("r099"))
        .unwrap()
        .unwrap();
    assert_eq!(next.as_str(), "http://r:5000/v2/_catalog?n=100&last=r099");
    assert_eq!(next_page(&next, None, 100, 0, Some("r099")).unwrap(), None);
    let linked = next_page(
        &first,
        Some(r#"</v2/_catalog?last=r1&n=100>; rel="next""#),
        100,
        100,
        Some("r1"),
    )
    .unwrap()
    .unwrap();
    assert_eq!(linked.as_str(), "http://r:5000/v2/_catalog?last=r1&n=100");
    assert!(
        next_page(
            &first,
            Some(r#"<http://evil/v2/_catalog>; rel="next""#),
            100,
            100,
            None
        )
        .is_err()
    );
    assert!(
        next_page(
            &first,
            Some(r#"</v2/_catalog?n=100>; rel="next""#),
            100,
            100,
            None
        )
        .is_err()
    );
}
