package crl_test

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/workload-ca/workload-ca/internal/testca"
	"github.com/workload-ca/workload-ca/revocation/crl"
)

var now = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func TestBuild(t *testing.T) {
	root := testca.NewRoot(t, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(24*time.Hour)))
	inter := testca.NewIntermediate(t, root, testca.P256, testca.Validity(now.Add(-time.Hour), now.Add(24*time.Hour)))
	noCRLSign := testca.NewRoot(t, testca.P256, func(c *x509.Certificate) { c.KeyUsage = x509.KeyUsageCertSign })
	serial := big.NewInt
	live, expired := now.Add(time.Hour), now.Add(-time.Minute)
	tests := []struct {
		name        string
		list        crl.List
		wantSerials []int64
		wantReasons []int
		wantErr     error
	}{
		{name: "no entries: a valid, signed, empty list", list: crl.List{Number: serial(1)}},
		{name: "entries by serial, each once, expired ones left out", list: crl.List{Number: serial(7), Entries: []crl.Entry{
			{Serial: serial(30), RevokedAt: now.Add(-time.Hour), Reason: crl.ReasonKeyCompromise, NotAfter: live},
			{Serial: serial(10), RevokedAt: now.Add(-time.Hour), NotAfter: live},
			{Serial: serial(20), RevokedAt: now.Add(-time.Hour), NotAfter: expired},
			{Serial: serial(30), RevokedAt: now.Add(-2 * time.Hour), Reason: crl.ReasonKeyCompromise, NotAfter: live},
		}}, wantSerials: []int64{10, 30}, wantReasons: []int{0, crl.ReasonKeyCompromise}},
		{name: "a root's own list", list: crl.List{Issuer: root.Cert, Signer: root.Key, Number: serial(2),
			Entries: []crl.Entry{{Serial: serial(5), RevokedAt: now, Reason: crl.ReasonCACompromise, NotAfter: live}}},
			wantSerials: []int64{5}, wantReasons: []int{crl.ReasonCACompromise}},
		{name: "an issuer that may not sign CRLs", list: crl.List{Issuer: noCRLSign.Cert, Signer: noCRLSign.Key, Number: serial(1)}, wantErr: crl.ErrNotCRLIssuer},
		{name: "no CRL number", list: crl.List{}, wantErr: crl.ErrInvalid},
		{name: "a CRL number over 20 octets", list: crl.List{Number: new(big.Int).Lsh(big.NewInt(1), 160)}, wantErr: crl.ErrInvalid},
		{name: "nextUpdate not after thisUpdate", list: crl.List{Number: serial(1), NextUpdate: now}, wantErr: crl.ErrInvalid},
		{name: "an unknown reason", list: crl.List{Number: serial(1), Entries: []crl.Entry{{Serial: serial(1), Reason: 9, NotAfter: live}}}, wantErr: crl.ErrInvalid},
		{name: "a serial that is not positive", list: crl.List{Number: serial(1), Entries: []crl.Entry{{Serial: serial(0), NotAfter: live}}}, wantErr: crl.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := tt.list
			if l.Issuer == nil && !errors.Is(tt.wantErr, crl.ErrNotCRLIssuer) {
				l.Issuer, l.Signer = inter.Cert, inter.Key
			}
			l.ThisUpdate = now
			if l.NextUpdate.IsZero() {
				l.NextUpdate = now.Add(time.Hour)
			}
			der, err := crl.Build(l)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Build: %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := x509.ParseRevocationList(der)
			if err != nil {
				t.Fatal(err)
			}
			if err := got.CheckSignatureFrom(l.Issuer); err != nil {
				t.Errorf("does not verify with its issuer: %v", err)
			}
			if got.Number.Cmp(l.Number) != 0 || !got.ThisUpdate.Equal(now) || !got.NextUpdate.Equal(l.NextUpdate) {
				t.Errorf("number %v, thisUpdate %v, nextUpdate %v", got.Number, got.ThisUpdate, got.NextUpdate)
			}
			if !bytes.Equal(got.AuthorityKeyId, l.Issuer.SubjectKeyId) || !bytes.Equal(got.RawIssuer, l.Issuer.RawSubject) {
				t.Error("the authority key identifier or the issuer name is not the issuer's")
			}
			var serials []int64
			var reasons []int
			for _, e := range got.RevokedCertificateEntries {
				serials, reasons = append(serials, e.SerialNumber.Int64()), append(reasons, e.ReasonCode)
			}
			if !slices.Equal(serials, tt.wantSerials) || !slices.Equal(reasons, tt.wantReasons) {
				t.Errorf("entries %v reasons %v, want %v %v", serials, reasons, tt.wantSerials, tt.wantReasons)
			}
		})
	}
}

// The file holds one X509 CRL block per list, each parsing on its own.
func TestPEM(t *testing.T) {
	var ders [][]byte
	for i := range 2 {
		ca := testca.NewRoot(t, testca.P256)
		der, err := crl.Build(crl.List{Issuer: ca.Cert, Signer: ca.Key, Number: big.NewInt(int64(i + 1)), ThisUpdate: now, NextUpdate: now.Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		ders = append(ders, der)
	}
	rest := crl.PEM(ders...)
	for i := range ders {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil || b.Type != "X509 CRL" || !bytes.Equal(b.Bytes, ders[i]) {
			t.Fatalf("block %d: %v", i, b)
		}
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		t.Errorf("left over: %q", rest)
	}
}
