package keystore

import (
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"time"

	"go.step.sm/crypto/pemutil"

	"github.com/workload-ca/workload-ca/ca"
)

// LoadOrCreate loads the material in dir if there is any. If dir is absent
// or holds no CA file, it generates a root (see GenerateRoot), writes it in
// the Istio cacerts layout so that a restart keeps the same root, and
// reports created. Partial material is an error: nothing is overwritten.
func LoadOrCreate(dir string, opts GenerateOptions, now time.Time) (*ca.Material, bool, error) {
	m, err := loadDir(dir, nil, now)
	if !errors.Is(err, ErrNoMaterial) {
		return m, false, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("ca-dir %s: %w", dir, err)
	}
	m, err = GenerateRoot(opts, now)
	if err != nil {
		return nil, false, err
	}
	if err := write(dir, m); err != nil {
		return nil, false, fmt.Errorf("ca-dir %s: %w", dir, err)
	}
	return m, true, nil
}

// write stores a generated root in the Istio layout. The key goes first
// and the root bundle last, so an interrupted write leaves a directory that
// LoadDir reports as incomplete rather than one that looks empty.
func write(dir string, m *ca.Material) error {
	keyBlock, err := pemutil.Serialize(m.Signer, pemutil.WithPKCS8(true))
	if err != nil {
		return fmt.Errorf("encoding the key: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: m.Cert.Raw})
	r, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	files := []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{IstioKeyFile, pem.EncodeToMemory(keyBlock), 0o600},
		{IstioCertFile, certPEM, 0o644},
		{IstioRootFile, certPEM, 0o644},
	}
	for _, f := range files {
		if err := writeFileAtomic(r, f.name, f.data, f.perm); err != nil {
			return err
		}
	}
	return syncDir(r)
}

// writeFileAtomic writes data to a temporary file in r, syncs it, and
// renames it to name, refusing to replace an existing file.
func writeFileAtomic(r *os.Root, name string, data []byte, perm os.FileMode) error {
	switch ok, err := exists(r, name); {
	case err != nil:
		return err
	case ok:
		return fmt.Errorf("%s already exists; not overwriting", name)
	}
	tmp := "." + name + ".tmp-" + rand.Text()
	f, err := r.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	err = fill(f, data, perm)
	if err == nil {
		err = r.Rename(tmp, name)
	}
	if err != nil {
		_ = r.Remove(tmp)
	}
	return err
}

// fill sets f's permissions (whatever the umask), writes data, syncs and
// closes f.
func fill(f *os.File, data []byte, perm os.FileMode) error {
	err := f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// syncDir makes the renames durable.
func syncDir(r *os.Root) error {
	d, err := r.Open(".")
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
