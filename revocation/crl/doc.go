// Package crl builds the certificate revocation lists the CA publishes:
// one per signing certificate, signed by it, RFC 5280 v2 (a CRL number,
// thisUpdate and nextUpdate, the issuer's authority key identifier, a
// reason code per entry), holding only the serials of certificates that
// are still valid, in the PEM form ztunnel and istio-agent read (one
// "X509 CRL" block per issuing certificate). A list without entries is a
// valid, signed CRL: it is how a lifted revocation is published, never as
// an empty file that clients keep the previous list for.
//
// It owns the encoding and its checks. It does not decide what is
// revoked, keep CRL numbers, or publish anything.
package crl
