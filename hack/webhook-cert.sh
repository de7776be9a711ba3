#!/usr/bin/env bash
# The self-signed alternative to cert-manager for the webhook's serving certificate.
#
#   hack/webhook-cert.sh --out DIR            make a CA and a serving certificate in DIR
#   hack/webhook-cert.sh --out DIR --apply    ...and install them: the Secret
#                                             kn-rescheduler/mutate-admission-tls and the CA in
#                                             the MutatingWebhookConfiguration's caBundle
#
# Run --apply after `kubectl apply -k knative/` (the webhook configuration must exist; the
# webhook's pods wait for the Secret). The certificate is valid for DAYS days (default 365):
# run it again before then, it replaces both (pods pick up the new files without a restart,
# and the caBundle is patched in the same run). Keep DIR private: it holds the CA key.
#
# Environment: KUBECTL (default kubectl), DAYS (default 365).
set -euo pipefail

namespace=kn-rescheduler
service=mutate-admission-webhook
secret=mutate-admission-tls
webhook=kn-rescheduler-mutate-admission
days=${DAYS:-365}
# A command and its flags, as the Makefile's KUBECTL (e.g. "kubectl --context prod").
read -r -a kubectl <<<"${KUBECTL:-kubectl}"
out=""
apply=false

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --apply) apply=true; shift ;;
    -h|--help) usage 0 ;;
    *) echo "unknown argument: $1" >&2; usage 2 ;;
  esac
done
[[ -n $out ]] || { echo "--out DIR is required" >&2; usage 2; }
command -v openssl >/dev/null || { echo "openssl is required" >&2; exit 1; }

mkdir -p "$out"
chmod 700 "$out"
umask 077

# The CA: only ever signs this one serving certificate.
openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
  -keyout "$out/ca.key" -out "$out/ca.crt" -days $((days * 5)) \
  -subj "/CN=kn-rescheduler-webhook-ca" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

# The serving certificate, for the names the API server checks for a service reference.
cat > "$out/serving.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:$service.$namespace.svc,DNS:$service.$namespace.svc.cluster.local
EOF
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
  -keyout "$out/tls.key" -out "$out/tls.csr" -subj "/CN=$service.$namespace.svc" 2>/dev/null
openssl x509 -req -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -out "$out/tls.crt" -days "$days" -extfile "$out/serving.ext" 2>/dev/null
rm -f "$out/tls.csr" "$out/serving.ext" "$out/ca.srl"
echo "wrote $out/ca.crt, $out/tls.crt, $out/tls.key (valid $days days)"

if $apply; then
  "${kubectl[@]}" -n "$namespace" create secret generic "$secret" --type=kubernetes.io/tls \
    --from-file=tls.crt="$out/tls.crt" --from-file=tls.key="$out/tls.key" \
    --from-file=ca.crt="$out/ca.crt" --dry-run=client -o yaml | "${kubectl[@]}" apply -f -
  ca_bundle=$(base64 < "$out/ca.crt" | tr -d '\n')
  # Every webhook of the configuration (pods, and Jobs for their disruption policy): a webhook
  # without the caBundle is never verified, and with failurePolicy Ignore its objects are
  # admitted silently without it.
  count=$("${kubectl[@]}" get mutatingwebhookconfiguration "$webhook" \
    -o jsonpath='{range .webhooks[*]}{.name}{"\n"}{end}' | grep -c . || true)
  [[ $count -gt 0 ]] || { echo "$webhook has no webhooks: apply knative/ first" >&2; exit 1; }
  ops=""
  for ((i = 0; i < count; i++)); do
    ops+="${ops:+,}{\"op\": \"add\", \"path\": \"/webhooks/$i/clientConfig/caBundle\", \"value\": \"$ca_bundle\"}"
  done
  "${kubectl[@]}" patch mutatingwebhookconfiguration "$webhook" --type=json -p "[$ops]"
  echo "installed Secret $namespace/$secret and the caBundle of the $count webhook(s) of $webhook"
fi
