#!/usr/bin/env bash
# Tests certs.sh: each command does what certs/README.md says, and each check can fail.
# Prints `N passed, 0 failed`; exits non-zero on the first failure.
set -euo pipefail
C="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/certs.sh"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
n=0
ok() { n=$((n + 1)); }
fail() { echo "certs/test.sh: FAIL: $*" >&2; exit 1; }
q() { "$C" "$@" 2>/dev/null; }

q ca --dir "$T/ca" --cn test-ca && ok || fail "ca"
[[ "$(stat -c %a "$T/ca/ca.key")" == 600 ]] && ok || fail "the CA key is not private"
openssl asn1parse -in "$T/ca/ca.crt" | grep -q 'UTF8STRING *:test-ca' && ok || fail "CA subject is not UTF8String"
q ca --dir "$T/ca" && fail "ca replaced an existing CA without --force" || ok
q issue --ca "$T/ca" --out "$T/tls" --dns svc.ns.svc --ip 127.0.0.1 && ok || fail "issue"
q check --ca "$T/ca" --cert "$T/tls.crt" --dns svc.ns.svc --ip 127.0.0.1 && ok || fail "check of a good cert"
openssl x509 -in "$T/tls.crt" -noout -ext extendedKeyUsage | grep -q 'Server Auth' && ok || fail "not serverAuth"
q check --ca "$T/ca" --cert "$T/tls.crt" --dns other.ns.svc && fail "check passed a missing DNS name" || ok
q check --ca "$T/ca" --cert "$T/tls.crt" --ip 127.0.0.2 && fail "check passed a missing IP" || ok
q check --ca "$T/ca" --cert "$T/tls.crt" --min-days 4000 && fail "check passed a cert near expiry" || ok
q issue --ca "$T/ca" --out "$T/short" --dns a --days 1 && ok || fail "issue --days 1"
q check --ca "$T/ca" --cert "$T/short.crt" && fail "check passed a 1-day cert (min 7 days)" || ok
q ca --dir "$T/other" && ok || fail "second CA"
q check --ca "$T/other" --cert "$T/tls.crt" && fail "check passed a cert of another CA" || ok
# ensure: keeps a good certificate, re-issues one the CA no longer signs.
before="$(openssl x509 -in "$T/tls.crt" -noout -serial)"
q ensure --ca "$T/ca" --out "$T/tls" --dns svc.ns.svc --ip 127.0.0.1 && ok || fail "ensure (good)"
[[ "$(openssl x509 -in "$T/tls.crt" -noout -serial)" == "$before" ]] && ok || fail "ensure re-issued a good cert"
q ensure --ca "$T/other" --out "$T/tls" --dns svc.ns.svc --ip 127.0.0.1 && ok || fail "ensure (other CA)"
q check --ca "$T/other" --cert "$T/tls.crt" --dns svc.ns.svc && ok || fail "ensure did not re-issue"
# rotate: a new certificate and a new key, same names.
key="$(sha256sum <"$T/tls.key")"
q rotate --ca "$T/other" --out "$T/tls" --dns svc.ns.svc --ip 127.0.0.1 && ok || fail "rotate"
[[ "$(sha256sum <"$T/tls.key")" != "$key" ]] && ok || fail "rotate kept the key"
q check --ca "$T/other" --cert "$T/tls.crt" --dns svc.ns.svc --ip 127.0.0.1 && ok || fail "rotated cert"
q issue --ca "$T/ca" --out "$T/admin" --cn admin --org system:masters --client && ok || fail "client cert"
openssl x509 -in "$T/admin.crt" -noout -ext extendedKeyUsage | grep -q 'Client Auth' && ok || fail "not clientAuth"
q issue --ca "$T/ca" --out "$T/bad" && fail "issued a serving cert without names" || ok
echo "certs: $n passed, 0 failed"
