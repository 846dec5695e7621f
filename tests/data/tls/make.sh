#!/usr/bin/env bash
# Makes the TLS test certificates (run once; the results are checked in):
# a CA, a server certificate for 127.0.0.1/localhost and a client
# certificate signed by it, and a stranger's CA and client certificate.
# Test keys only: they protect nothing.
set -euo pipefail
cd "$(dirname "$0")"
days=36500
for ca in ca stranger_ca; do
  openssl req -x509 -newkey rsa:2048 -nodes -keyout $ca.key -out $ca.pem -days $days -subj "/CN=shoal test $ca" 2>/dev/null
done
sign() {  # name, ca, extensions
  openssl req -newkey rsa:2048 -nodes -keyout $1.key -out $1.csr -subj "/CN=shoal test $1" 2>/dev/null
  printf '%s\n' "$3" > $1.ext
  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -out $1.pem -days $days -extfile $1.ext 2>/dev/null
  rm -f $1.csr $1.ext
}
sign server ca "subjectAltName=IP:127.0.0.1,DNS:localhost"
sign client ca "extendedKeyUsage=clientAuth"
sign stranger stranger_ca "extendedKeyUsage=clientAuth"
rm -f ./*.srl ca.key stranger_ca.key
