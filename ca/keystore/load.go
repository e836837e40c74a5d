package keystore

import (
	"crypto"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/workload-ca/workload-ca/ca"
)

// File names of the two directory layouts LoadDir understands.
const (
	// Istio cacerts: the signing certificate, its key, the root bundle, and
	// optionally the signing certificate followed by its chain.
	IstioCertFile  = "ca-cert.pem"
	IstioKeyFile   = "ca-key.pem"
	IstioRootFile  = "root-cert.pem"
	IstioChainFile = "cert-chain.pem"
	// cert-manager (kubernetes.io/tls Secret): the signing certificate
	// optionally followed by intermediates, its key, and the root bundle.
	TLSCertFile = "tls.crt"
	TLSKeyFile  = "tls.key"
	TLSCAFile   = "ca.crt"
)

// ErrNoMaterial is wrapped when a directory holds no file of either layout.
var ErrNoMaterial = errors.New("no CA material")

// ErrAmbiguousKey is wrapped when a directory holds a key file although
// the signing key is held elsewhere.
var ErrAmbiguousKey = errors.New("two signing keys")

// ErrIncomplete is wrapped when a directory holds some but not all of the
// files of a layout.
var ErrIncomplete = errors.New("incomplete CA material")

// layout names the files of one directory layout; chain is optional. key
// is empty when the key is held elsewhere, and keyFile then names the file
// that must not be there.
type layout struct {
	cert, key, roots, chain string
	keyFile                 string
}

func layouts() []layout {
	return []layout{
		{cert: IstioCertFile, key: IstioKeyFile, roots: IstioRootFile, chain: IstioChainFile},
		{cert: TLSCertFile, key: TLSKeyFile, roots: TLSCAFile},
	}
}

// LoadDir reads CA material from dir, in the Istio cacerts layout or the
// cert-manager layout, and validates it at the current time. A non-nil key
// is the signing key, held outside the directory (see OpenKey): the
// directory then holds the certificates only, and a key file there is an
// error rather than a second key to choose from.
func LoadDir(dir string, key crypto.Signer) (*ca.Material, error) {
	return loadDir(dir, key, time.Now())
}

func loadDir(dir string, key crypto.Signer, now time.Time) (*ca.Material, error) {
	m, err := readDir(dir, layouts(), key)
	if err == nil {
		err = m.Validate(now)
	}
	if err != nil {
		return nil, fmt.Errorf("ca-dir %s: %w", dir, err)
	}
	return m, nil
}

// readDir reads the material of the first complete layout of ls in dir,
// without validating it. With a key, the layouts' key files are not read,
// and must not be there.
func readDir(dir string, ls []layout, key crypto.Signer) (*ca.Material, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %w", ErrNoMaterial, err)
		}
		return nil, err
	}
	defer r.Close()
	if key != nil {
		ls = withoutKeyFiles(ls)
	}
	l, err := detect(r, ls)
	if err != nil {
		return nil, err
	}
	if key != nil {
		if err := checkNoKeyFile(r, l); err != nil {
			return nil, err
		}
	}
	return l.load(r, key)
}

// withoutKeyFiles returns the layouts with no key file to read, keeping
// its name in keyFile.
func withoutKeyFiles(ls []layout) []layout {
	out := make([]layout, len(ls))
	for i, l := range ls {
		l.keyFile, l.key = l.key, ""
		out[i] = l
	}
	return out
}

// checkNoKeyFile refuses a key file beside an external key: which of the
// two signs would be a guess.
func checkNoKeyFile(r *os.Root, l layout) error {
	switch ok, err := exists(r, l.keyFile); {
	case err != nil:
		return err
	case ok:
		return fmt.Errorf("%w: %s is there although the signing key comes from a key URI: remove one of them", ErrAmbiguousKey, l.keyFile)
	}
	return nil
}

// detect returns the first layout of ls whose required files are all
// present. Failing that, a layout with some of its files present is an
// error naming the first missing file; no file at all is ErrNoMaterial.
func detect(r *os.Root, ls []layout) (layout, error) {
	var partialMissing string
	for _, l := range ls {
		present, missing, err := l.presence(r)
		if err != nil {
			return layout{}, err
		}
		if len(missing) == 0 {
			return l, nil
		}
		if present > 0 && partialMissing == "" {
			partialMissing = missing[0]
		}
	}
	if partialMissing != "" {
		return layout{}, fmt.Errorf("%s missing: %w", partialMissing, ErrIncomplete)
	}
	return layout{}, ErrNoMaterial
}

// presence counts the layout's files found in r (optional ones included)
// and lists the required ones that are missing.
func (l layout) presence(r *os.Root) (present int, missing []string, err error) {
	for _, name := range []string{l.cert, l.key, l.roots, l.chain} {
		if name == "" {
			continue
		}
		ok, err := exists(r, name)
		switch {
		case err != nil:
			return 0, nil, err
		case ok:
			present++
		case name != l.chain:
			missing = append(missing, name)
		}
	}
	return present, missing, nil
}

func exists(r *os.Root, name string) (bool, error) {
	_, err := r.Stat(name)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, err
	}
}
