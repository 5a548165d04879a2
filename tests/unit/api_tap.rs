//! The apiserver tap's request classes (testkit::api_tap), which the partition tests
//! count and cut by.

use http::Method;
use testkit::api_tap::{Kind, is_informer, kind};

#[test]
fn kinds() {
    let k = |m: Method, p: &str, q: &str| kind(&m, p, q);
    let lease = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l";
    assert_eq!(k(Method::GET, lease, ""), Kind::LeaseRead);
    assert_eq!(k(Method::PATCH, lease, ""), Kind::LeaseWrite);
    assert_eq!(
        k(
            Method::POST,
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases",
            ""
        ),
        Kind::LeaseWrite
    );
    let crs = "/apis/cocoonset.cocoonstack.io/v1/namespaces/ns/cocoonhibernations";
    assert_eq!(k(Method::GET, &format!("{crs}/a"), ""), Kind::CrGet);
    assert_eq!(k(Method::GET, crs, "watch=true"), Kind::CrWatch);
    assert_eq!(k(Method::GET, crs, ""), Kind::CrOther);
    let all = "/apis/cocoonset.cocoonstack.io/v1/cocoonhibernations";
    assert_eq!(k(Method::GET, all, "watch=1"), Kind::CrWatch);
    assert_eq!(k(Method::GET, "/api/v1/pods", "watch=true"), Kind::PodWatch);
    assert_eq!(k(Method::GET, "/api/v1/namespaces/ns", ""), Kind::Other);
    assert_eq!(
        k(Method::PATCH, &format!("{crs}/a/status"), ""),
        Kind::CrOther
    );
    let pods = "/api/v1/namespaces/ns/pods";
    assert_eq!(k(Method::GET, &format!("{pods}/p"), ""), Kind::PodGet);
    assert_eq!(
        k(Method::GET, pods, "allowWatchBookmarks=true&watch=true"),
        Kind::PodWatch
    );
    assert_eq!(k(Method::GET, pods, "limit=500"), Kind::PodList);
}

#[test]
fn informers() {
    let crs = "/apis/cocoonset.cocoonstack.io/v1/namespaces/ns/cocoonhibernations";
    assert!(is_informer(&Method::GET, crs));
    assert!(is_informer(&Method::GET, "/api/v1/pods"));
    assert!(is_informer(&Method::GET, "/api/v1/namespaces/ns/pods/"));
    assert!(!is_informer(&Method::POST, "/api/v1/namespaces/ns/pods"));
    assert!(!is_informer(&Method::GET, "/api/v1/namespaces/ns/pods/p"));
    assert!(!is_informer(&Method::GET, &format!("{crs}/a/status")));
    assert!(!is_informer(
        &Method::GET,
        "/apis/coordination.k8s.io/v1/namespaces/ns/leases"
    ));
}
