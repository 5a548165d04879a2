#!/usr/bin/env bash
# Local TLS tooling for cocoon-hibernation: a CA, certificates signed by it (the webhook's
# serving certificate, the local control plane's), a chain and expiry check, and rotation.
# Used by `make demo` (cargo xtask demo), the tests' control plane (cargo xtask cluster-up) and
# installs without cert-manager. See certs/README.md.
#
#   certs.sh ca     --dir DIR [--cn NAME] [--days N] [--force]
#   certs.sh issue  --ca DIR --out PATH [--cn NAME] [--org O] [--dns NAME]... [--ip ADDR]...
#                   [--client] [--days N]
#   certs.sh check  --ca DIR --cert FILE [--dns NAME]... [--ip ADDR]... [--min-days N]
#   certs.sh ensure (the flags of issue, plus --min-days N)
#   certs.sh rotate (the flags of issue)
#
# Keys are EC P-256 in PKCS#8, mode 600. Subjects are written as UTF8String (string_mask
# utf8only): testkit/src/cluster.rs rebuilds the CA's name with rcgen to sign webhook
# certificates, and verifiers compare the issuer's bytes.
set -euo pipefail

log() { echo "[certs] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { sed -n '7,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
command -v openssl >/dev/null || die "openssl is required (apt-get install openssl)"

cmd="${1:-}"
[[ -n "$cmd" ]] || usage
shift
DIR="" CA="" OUT="" CERT="" CN="" ORG="" DAYS=3650 MIN_DAYS=7 CLIENT=false FORCE=false DNS=() IPS=()
while (($#)); do
  case "$1" in
    --dir) DIR="$2" ;;
    --ca) CA="$2" ;;
    --out) OUT="$2" ;;
    --cert) CERT="$2" ;;
    --cn) CN="$2" ;;
    --org) ORG="$2" ;;
    --days) DAYS="$2" ;;
    --min-days) MIN_DAYS="$2" ;;
    --dns) DNS+=("$2") ;;
    --ip) IPS+=("$2") ;;
    --client) CLIENT=true; shift; continue ;;
    --force) FORCE=true; shift; continue ;;
    *) die "unknown argument: $1" ;;
  esac
  shift 2 || die "$1 needs a value"
done
[[ "$DAYS" =~ ^[0-9]+$ && "$MIN_DAYS" =~ ^[0-9]+$ ]] || die "--days and --min-days take whole days"

# The request config: UTF8String subjects, no prompts, and the CA's extensions.
config() {
  cat <<'EOF'
[req]
distinguished_name = dn
string_mask = utf8only
prompt = no
[dn]
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
EOF
}

new_key() {
  (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null)
}

make_ca() {
  [[ -n "$DIR" ]] || die "ca needs --dir"
  # A new CA invalidates every certificate it signed: only on purpose.
  if [[ -e "$DIR/ca.key" ]] && ! $FORCE; then die "$DIR already has a CA; add --force to replace it"; fi
  mkdir -p "$DIR"
  local cnf
  cnf="$(mktemp)"
  config >"$cnf"
  new_key "$DIR/ca.key.tmp"
  openssl req -x509 -new -key "$DIR/ca.key.tmp" -subj "/CN=${CN:-cocoon-hibernation-local-ca}" \
    -config "$cnf" -extensions v3_ca -days "$DAYS" -sha256 -out "$DIR/ca.crt.tmp"
  rm -f "$cnf"
  mv "$DIR/ca.key.tmp" "$DIR/ca.key"
  mv "$DIR/ca.crt.tmp" "$DIR/ca.crt"
  log "CA $DIR/ca.crt (key $DIR/ca.key), $DAYS days"
}

issue() {
  [[ -n "$CA" && -n "$OUT" ]] || die "issue needs --ca DIR and --out PATH"
  [[ -f "$CA/ca.crt" && -f "$CA/ca.key" ]] || die "no CA in $CA (make one: certs.sh ca --dir $CA)"
  mkdir -p "$(dirname "$OUT")"
  local subj="/CN=${CN:-${DNS[0]:-${IPS[0]:-cocoon-hibernation}}}" cnf ext san=() d
  [[ -n "$ORG" ]] && subj="/O=$ORG$subj"
  for d in "${DNS[@]}"; do san+=("DNS:$d"); done
  for d in "${IPS[@]}"; do san+=("IP:$d"); done
  if ! $CLIENT && ((${#san[@]} == 0)); then die "a serving certificate needs --dns or --ip"; fi
  cnf="$(mktemp)" ext="$(mktemp)"
  config >"$cnf"
  {
    echo 'basicConstraints = critical,CA:FALSE'
    echo 'keyUsage = critical,digitalSignature'
    if $CLIENT; then echo 'extendedKeyUsage = clientAuth'; else echo 'extendedKeyUsage = serverAuth'; fi
    if ((${#san[@]})); then echo "subjectAltName = $(IFS=,; echo "${san[*]}")"; fi
  } >"$ext"
  # A new key on every issue: rotation never reuses one.
  new_key "$OUT.key.tmp"
  openssl req -new -key "$OUT.key.tmp" -subj "$subj" -config "$cnf" |
    openssl x509 -req -CA "$CA/ca.crt" -CAkey "$CA/ca.key" \
      -set_serial "0x$(openssl rand -hex 12)" -days "$DAYS" -sha256 \
      -extfile "$ext" -out "$OUT.crt.tmp" 2>/dev/null
  rm -f "$cnf" "$ext"
  mv "$OUT.key.tmp" "$OUT.key"
  mv "$OUT.crt.tmp" "$OUT.crt"
  log "issued $OUT.crt ($subj${san[*]:+, ${san[*]}}), $DAYS days, signed by $CA/ca.crt"
}

# check: the certificate chains to the CA, covers every --dns/--ip, and is valid for at
# least MIN_DAYS more days. Prints why not, and fails, otherwise.
check() {
  local cert="${CERT:-${OUT:+$OUT.crt}}" d
  [[ -n "$CA" && -n "$cert" ]] || die "check needs --ca DIR and --cert FILE"
  [[ -s "$cert" ]] || { log "$cert: missing"; return 1; }
  [[ -s "$CA/ca.crt" ]] || { log "$CA/ca.crt: missing"; return 1; }
  openssl verify -CAfile "$CA/ca.crt" "$cert" >/dev/null 2>&1 ||
    { log "$cert: not signed by $CA/ca.crt"; return 1; }
  openssl x509 -in "$cert" -noout -checkend "$((MIN_DAYS * 86400))" >/dev/null ||
    { log "$cert: expires within $MIN_DAYS days ($(openssl x509 -in "$cert" -noout -enddate))"; return 1; }
  openssl x509 -in "$CA/ca.crt" -noout -checkend "$((MIN_DAYS * 86400))" >/dev/null ||
    { log "$CA/ca.crt: expires within $MIN_DAYS days"; return 1; }
  for d in "${DNS[@]}"; do
    openssl x509 -in "$cert" -noout -checkhost "$d" | grep -q ' does match' ||
      { log "$cert: does not cover DNS name $d"; return 1; }
  done
  for d in "${IPS[@]}"; do
    openssl x509 -in "$cert" -noout -checkip "$d" | grep -q ' does match' ||
      { log "$cert: does not cover IP $d"; return 1; }
  done
  if [[ -n "$OUT" && ! -s "$OUT.key" ]]; then log "$OUT.key: missing"; return 1; fi
  log "$cert: ok (chains to $CA/ca.crt, $(openssl x509 -in "$cert" -noout -enddate))"
}

case "$cmd" in
  ca) make_ca ;;
  issue) issue ;;
  check) check ;;
  ensure)
    if [[ ! -s "$OUT.crt" ]]; then issue; else check || { log "issuing $OUT.crt again"; issue; }; fi ;;
  rotate) issue ;;
  -h | --help | help) usage ;;
  *) die "unknown command: $cmd (ca, issue, check, ensure, rotate)" ;;
esac
