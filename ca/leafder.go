package ca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"time"
	"unicode/utf8"

	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
)

// The leaf encoder below builds, with cryptobyte, the DER that
// x509.CreateCertificate builds for the CA's leaf templates, byte for byte
// (a differential test and a fuzz test hold it to that). CreateCertificate
// encodes by reflection, re-encodes the parts every leaf of a signing
// certificate shares, and was a fifth of the signing path's CPU and a
// quarter of its garbage. What it checks is still checked: the signature
// is verified once, with the signing certificate's key, and the parsed leaf
// is held to its spec (checkIssued).

// sigParams is how the signing key signs: computed once per material.
type sigParams struct {
	hash crypto.Hash // zero for Ed25519, which signs the message itself
	ai   []byte      // DER AlgorithmIdentifier
}

// Object identifiers (RFC 5280, RFC 5758, RFC 8410), as functions so that
// no caller can change them.
func oidECDSAWithSHA256() asn1.ObjectIdentifier {
	return asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 2}
}
func oidECDSAWithSHA384() asn1.ObjectIdentifier {
	return asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 3}
}
func oidECDSAWithSHA512() asn1.ObjectIdentifier {
	return asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 4}
}
func oidSHA256WithRSA() asn1.ObjectIdentifier {
	return asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 1, 11}
}
func oidEd25519() asn1.ObjectIdentifier     { return asn1.ObjectIdentifier{1, 3, 101, 112} }
func oidKeyUsage() asn1.ObjectIdentifier    { return asn1.ObjectIdentifier{2, 5, 29, 15} }
func oidExtKeyUsage() asn1.ObjectIdentifier { return asn1.ObjectIdentifier{2, 5, 29, 37} }
func oidBasicConstraints() asn1.ObjectIdentifier {
	return asn1.ObjectIdentifier{2, 5, 29, 19}
}
func oidAuthorityKeyID() asn1.ObjectIdentifier { return asn1.ObjectIdentifier{2, 5, 29, 35} }
func oidServerAuth() asn1.ObjectIdentifier     { return asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 1} }
func oidClientAuth() asn1.ObjectIdentifier     { return asn1.ObjectIdentifier{1, 3, 6, 1, 5, 5, 7, 3, 2} }

// signatureParamsFor returns the algorithm x509.CreateCertificate picks for
// a key (its default: SHA-256 for RSA and P-256, the curve's size for the
// other curves).
func signatureParamsFor(pub crypto.PublicKey) (sigParams, error) {
	var p sigParams
	var oid asn1.ObjectIdentifier
	withNull := false
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			p.hash, oid = crypto.SHA256, oidECDSAWithSHA256()
		case elliptic.P384():
			p.hash, oid = crypto.SHA384, oidECDSAWithSHA384()
		case elliptic.P521():
			p.hash, oid = crypto.SHA512, oidECDSAWithSHA512()
		default:
			return p, fmt.Errorf("unsupported ECDSA curve %s", k.Curve.Params().Name)
		}
	case *rsa.PublicKey:
		p.hash, oid, withNull = crypto.SHA256, oidSHA256WithRSA(), true
	case ed25519.PublicKey:
		oid = oidEd25519()
	default:
		return p, fmt.Errorf("unsupported signing key type %T", pub)
	}
	var b cryptobyte.Builder
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddASN1ObjectIdentifier(oid)
		if withNull {
			b.AddASN1NULL()
		}
	})
	ai, err := b.Bytes()
	if err != nil {
		return p, err
	}
	p.ai = ai
	return p, nil
}

// leafEncoder encodes the leaves of one signing certificate. What every
// leaf of it shares is encoded once, when the material is loaded.
type leafEncoder struct {
	sig     sigParams
	version []byte // [0] EXPLICIT INTEGER 2: X.509 v3
	issuer  []byte // DER Name: the signing certificate's RawSubject
	// shared is the extensions every leaf carries unchanged, in
	// x509.CreateCertificate's order between the extended key usage and
	// the SANs: basicConstraints (cA FALSE) and authorityKeyIdentifier
	// (the signing certificate's subject key identifier, if it has one).
	shared []byte
	// usages is the key usage and extended key usage extensions of the
	// CA's leaf profiles (SVID, serving) for each key usage keyUsageFor
	// gives: every SVID to an ECDSA key carries the same bytes.
	usages []encodedUsage
	// ecKeys is the start of the SubjectPublicKeyInfo of an ECDSA key on
	// each of subjectCurves: the same for every key of the curve, up to
	// its uncompressed point, which is of fixed length.
	ecKeys []ecKeyPrefix
}

type encodedUsage struct {
	keyUsage    x509.KeyUsage
	extKeyUsage []x509.ExtKeyUsage
	der         []byte
}

type ecKeyPrefix struct {
	curve  elliptic.Curve
	prefix []byte
}

// svidExtKeyUsage and servingExtKeyUsage are the extended key usages of
// the CA's two kinds of leaf: workload SVIDs (mTLS both ways) and the
// serving certificate of its own endpoint.
func svidExtKeyUsage() []x509.ExtKeyUsage {
	return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
}
func servingExtKeyUsage() []x509.ExtKeyUsage { return []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth} }

func newLeafEncoder(issuer *x509.Certificate, signer crypto.PublicKey) (*leafEncoder, error) {
	sig, err := signatureParamsFor(signer)
	if err != nil {
		return nil, err
	}
	var v cryptobyte.Builder
	v.AddASN1(cbasn1.Tag(0).Constructed().ContextSpecific(), func(b *cryptobyte.Builder) { b.AddASN1Int64(2) })
	version, err := v.Bytes()
	if err != nil {
		return nil, err
	}
	var b cryptobyte.Builder
	// cA FALSE and no path length: both DEFAULT, so an empty SEQUENCE.
	addExtension(&b, oidBasicConstraints(), true, func(b *cryptobyte.Builder) {
		b.AddASN1(cbasn1.SEQUENCE, func(*cryptobyte.Builder) {})
	})
	if len(issuer.SubjectKeyId) > 0 {
		addExtension(&b, oidAuthorityKeyID(), false, func(b *cryptobyte.Builder) {
			b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
				b.AddASN1(cbasn1.Tag(0).ContextSpecific(), func(b *cryptobyte.Builder) { b.AddBytes(issuer.SubjectKeyId) })
			})
		})
	}
	shared, err := b.Bytes()
	if err != nil {
		return nil, err
	}
	e := &leafEncoder{sig: sig, version: version, issuer: issuer.RawSubject, shared: shared}
	for _, ku := range []x509.KeyUsage{x509.KeyUsageDigitalSignature, x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment} {
		for _, eku := range [][]x509.ExtKeyUsage{svidExtKeyUsage(), servingExtKeyUsage()} {
			var b cryptobyte.Builder
			addUsageExtensions(&b, ku, eku)
			der, err := b.Bytes()
			if err != nil {
				return nil, err
			}
			e.usages = append(e.usages, encodedUsage{keyUsage: ku, extKeyUsage: eku, der: der})
		}
	}
	for _, curve := range subjectCurves() {
		prefix, err := ecSPKIPrefix(curve)
		if err != nil {
			return nil, err
		}
		e.ecKeys = append(e.ecKeys, ecKeyPrefix{curve: curve, prefix: prefix})
	}
	return e, nil
}

// ecSPKIPrefix returns what x509.MarshalPKIXPublicKey writes for a key on
// curve before its point: the encoding of a fresh key, without the point.
func ecSPKIPrefix(curve elliptic.Curve) ([]byte, error) {
	k, err := ecdsa.GenerateKey(curve, rand.Reader)
	if err != nil {
		return nil, err
	}
	point, err := k.PublicKey.Bytes()
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		return nil, err
	}
	return der[:len(der)-len(point)], nil
}

// marshalSPKI returns what x509.MarshalPKIXPublicKey returns for pub. For
// the ECDSA keys of subjectCurves, every ztunnel's, it appends the point
// to the curve's prefix instead of encoding by reflection.
func (e *leafEncoder) marshalSPKI(pub crypto.PublicKey) ([]byte, error) {
	k, ok := pub.(*ecdsa.PublicKey)
	if !ok {
		return x509.MarshalPKIXPublicKey(pub)
	}
	for _, c := range e.ecKeys {
		if c.curve != k.Curve {
			continue
		}
		point, err := k.Bytes()
		if err != nil {
			return nil, err
		}
		return append(append(make([]byte, 0, len(c.prefix)+len(point)), c.prefix...), point...), nil
	}
	return x509.MarshalPKIXPublicKey(pub)
}

// leafFields is what differs between the leaves of one signing
// certificate.
type leafFields struct {
	serial              *big.Int
	notBefore, notAfter time.Time
	spki                []byte // DER SubjectPublicKeyInfo
	keyUsage            x509.KeyUsage
	extKeyUsage         []x509.ExtKeyUsage
	dnsNames            []string
	uri                 string // the SPIFFE ID; empty for none
}

// appendTBS appends the DER TBSCertificate of f to dst.
func (e *leafEncoder) appendTBS(dst []byte, f *leafFields) ([]byte, error) {
	if f.serial == nil || f.serial.Sign() <= 0 {
		return nil, errors.New("serial number must be positive")
	}
	b := cryptobyte.NewBuilder(dst)
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddBytes(e.version)
		b.AddASN1BigInt(f.serial)
		b.AddBytes(e.sig.ai)
		b.AddBytes(e.issuer)
		b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
			addTime(b, f.notBefore)
			addTime(b, f.notAfter)
		})
		b.AddBytes(emptyName[:])
		b.AddBytes(f.spki)
		b.AddASN1(cbasn1.Tag(3).Constructed().ContextSpecific(), func(b *cryptobyte.Builder) {
			b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
				e.addExtensions(b, f)
			})
		})
	})
	return b.Bytes()
}

// emptyName is the DER of an empty Name: the leaf's subject.
var emptyName = [...]byte{0x30, 0x00}

// addExtensions writes the extensions in x509.CreateCertificate's order.
// The subject is empty, so the SAN extension is critical (RFC 5280,
// 4.2.1.6).
func (e *leafEncoder) addExtensions(b *cryptobyte.Builder, f *leafFields) {
	if der, ok := e.encodedUsage(f.keyUsage, f.extKeyUsage); ok {
		b.AddBytes(der)
	} else {
		addUsageExtensions(b, f.keyUsage, f.extKeyUsage)
	}
	b.AddBytes(e.shared)
	if len(f.dnsNames) > 0 || f.uri != "" {
		addExtension(b, oidSubjectAltName(), true, func(b *cryptobyte.Builder) {
			b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
				for _, name := range f.dnsNames {
					addIA5(b, 2, name) // dNSName
				}
				if f.uri != "" {
					addIA5(b, 6, f.uri) // uniformResourceIdentifier
				}
			})
		})
	}
}

// encodedUsage returns the usage extensions of a profile encoded when the
// material was loaded.
func (e *leafEncoder) encodedUsage(ku x509.KeyUsage, eku []x509.ExtKeyUsage) ([]byte, bool) {
	for _, u := range e.usages {
		if u.keyUsage == ku && slices.Equal(u.extKeyUsage, eku) {
			return u.der, true
		}
	}
	return nil, false
}

// addUsageExtensions writes the key usage extension (critical) and the
// extended key usage extension, each if there is a usage to write.
func addUsageExtensions(b *cryptobyte.Builder, ku x509.KeyUsage, eku []x509.ExtKeyUsage) {
	if ku != 0 {
		addExtension(b, oidKeyUsage(), true, func(b *cryptobyte.Builder) { addKeyUsage(b, ku) })
	}
	if len(eku) > 0 {
		addExtension(b, oidExtKeyUsage(), false, func(b *cryptobyte.Builder) {
			b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
				for _, u := range eku {
					oid, ok := extKeyUsageOID(u)
					if !ok {
						b.SetError(fmt.Errorf("unsupported extended key usage %d", u))
						return
					}
					b.AddASN1ObjectIdentifier(oid)
				}
			})
		})
	}
}

// addExtension writes an Extension; critical is DEFAULT FALSE, so written
// only when true.
func addExtension(b *cryptobyte.Builder, oid asn1.ObjectIdentifier, critical bool, value cryptobyte.BuilderContinuation) {
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddASN1ObjectIdentifier(oid)
		if critical {
			b.AddASN1Boolean(true)
		}
		b.AddASN1(cbasn1.OCTET_STRING, value)
	})
}

// addKeyUsage writes the KeyUsage BIT STRING: bit 0 (digitalSignature) is
// the first bit, and trailing zero bits are not encoded.
func addKeyUsage(b *cryptobyte.Builder, ku x509.KeyUsage) {
	bits := [2]byte{reverseBits(byte(ku)), reverseBits(byte(ku >> 8))}
	n := 1
	if bits[1] != 0 {
		n = 2
	}
	unused := 0
	if last := bits[n-1]; last != 0 {
		for last&1 == 0 {
			last >>= 1
			unused++
		}
	}
	b.AddASN1(cbasn1.BIT_STRING, func(b *cryptobyte.Builder) {
		b.AddUint8(uint8(unused))
		b.AddBytes(bits[:n])
	})
}

func reverseBits(in byte) byte {
	var out byte
	for range 8 {
		out = out<<1 | in&1
		in >>= 1
	}
	return out
}

func extKeyUsageOID(u x509.ExtKeyUsage) (asn1.ObjectIdentifier, bool) {
	switch u {
	case x509.ExtKeyUsageServerAuth:
		return oidServerAuth(), true
	case x509.ExtKeyUsageClientAuth:
		return oidClientAuth(), true
	}
	return nil, false
}

// addIA5 writes a context-specific GeneralName whose value must be ASCII.
func addIA5(b *cryptobyte.Builder, tag uint8, s string) {
	for i := range len(s) {
		if s[i] >= utf8.RuneSelf {
			b.SetError(fmt.Errorf("name %q is not ASCII", s))
			return
		}
	}
	b.AddASN1(cbasn1.Tag(tag).ContextSpecific(), func(b *cryptobyte.Builder) { b.AddBytes([]byte(s)) })
}

// addTime writes UTCTime for the years 1950-2049 and GeneralizedTime
// otherwise (RFC 5280, 4.1.2.5), at whole seconds.
func addTime(b *cryptobyte.Builder, t time.Time) {
	t = t.UTC().Truncate(time.Second)
	if y := t.Year(); y >= 1950 && y < 2050 {
		b.AddASN1UTCTime(t)
		return
	}
	b.AddASN1GeneralizedTime(t)
}

// certificate returns the DER Certificate of tbs and its signature.
func (e *leafEncoder) certificate(tbs, signature []byte) ([]byte, error) {
	b := cryptobyte.NewBuilder(make([]byte, 0, len(tbs)+len(e.sig.ai)+len(signature)+16))
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		b.AddBytes(tbs)
		b.AddBytes(e.sig.ai)
		b.AddASN1(cbasn1.BIT_STRING, func(b *cryptobyte.Builder) {
			b.AddUint8(0)
			b.AddBytes(signature)
		})
	})
	return b.Bytes()
}
