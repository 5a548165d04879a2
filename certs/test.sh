#!/usr/bin/env bash
# Tests certs.sh: each command does what certs/README.md says, and each check can fail.
# Prints `certs: N passed, 0 failed`; exits non-zero on the first failure.
set -euo pipefail
C="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/certs.sh"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
n=0
# pass WHAT CMD...: CMD must succeed. fail WHAT CMD...: CMD must fail.
pass() { local what="$1"; shift; if "$@" 2>/dev/null; then n=$((n + 1)); else echo "certs/test.sh: FAIL: $what" >&2; exit 1; fi; }
fail() { local what="$1"; shift; if "$@" 2>/dev/null; then echo "certs/test.sh: FAIL: $what" >&2; exit 1; else n=$((n + 1)); fi; }

pass "ca" "$C" ca --dir "$T/ca" --cn test-ca
pass "the CA key is private" test "$(stat -c %a "$T/ca/ca.key")" = 600
pass "the CA subject is a UTF8String" bash -c "openssl asn1parse -in '$T/ca/ca.crt' | grep -q 'UTF8STRING *:test-ca'"
fail "ca replaces an existing CA only with --force" "$C" ca --dir "$T/ca"
pass "issue" "$C" issue --ca "$T/ca" --out "$T/tls" --dns svc.ns.svc --ip 127.0.0.1
pass "check passes a good certificate" "$C" check --ca "$T/ca" --cert "$T/tls.crt" --dns svc.ns.svc --ip 127.0.0.1
pass "a serving certificate is serverAuth" bash -c "openssl x509 -in '$T/tls.crt' -noout -ext extendedKeyUsage | grep -q 'Server Auth'"
fail "check fails a missing DNS name" "$C" check --ca "$T/ca" --cert "$T/tls.crt" --dns other.ns.svc
fail "check fails a missing IP" "$C" check --ca "$T/ca" --cert "$T/tls.crt" --ip 127.0.0.2
fail "check fails a certificate near expiry" "$C" check --ca "$T/ca" --cert "$T/tls.crt" --min-days 4000
pass "issue --days 1" "$C" issue --ca "$T/ca" --out "$T/short" --dns a --days 1
fail "check fails a 1-day certificate (a week is the minimum)" "$C" check --ca "$T/ca" --cert "$T/short.crt"
pass "a second CA" "$C" ca --dir "$T/other"
fail "check fails a certificate of another CA" "$C" check --ca "$T/other" --cert "$T/tls.crt"
# ensure: keeps a good certificate, issues again one the CA no longer signs.
before="$(openssl x509 -in "$T/tls.crt" -noout -serial)"
pass "ensure (good certificate)" "$C" ensure --ca "$T/ca" --out "$T/tls" --dns svc.ns.svc --ip 127.0.0.1
pass "ensure keeps a good certificate" test "$(openssl x509 -in "$T/tls.crt" -noout -serial)" = "$before"
pass "ensure (another CA)" "$C" ensure --ca "$T/other" --out "$T/tls" --dns svc.ns.svc --ip 127.0.0.1
pass "ensure issued again for the other CA" "$C" check --ca "$T/other" --cert "$T/tls.crt" --dns svc.ns.svc
# rotate: a new certificate and a new key, same names.
key="$(sha256sum <"$T/tls.key")"
pass "rotate" "$C" rotate --ca "$T/other" --out "$T/tls" --dns svc.ns.svc --ip 127.0.0.1
pass "rotate makes a new key" test "$(sha256sum <"$T/tls.key")" != "$key"
pass "the rotated certificate checks" "$C" check --ca "$T/other" --cert "$T/tls.crt" --dns svc.ns.svc --ip 127.0.0.1
pass "a client certificate" "$C" issue --ca "$T/ca" --out "$T/admin" --cn admin --org system:masters --client
pass "a client certificate is clientAuth" bash -c "openssl x509 -in '$T/admin.crt' -noout -ext extendedKeyUsage | grep -q 'Client Auth'"
fail "a serving certificate needs a name" "$C" issue --ca "$T/ca" --out "$T/bad"
echo "certs: $n passed, 0 failed"
