package e2e_test

import (
	"archive/tar"
	"debug/buildinfo"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/workload-ca/workload-ca/e2e/cahost"
)

// TestImage takes the container image `make image` built (an OCI layout,
// $WORKLOAD_CA_IMAGE_LAYOUT) apart: this machine's platform is in its
// index, it runs as the nonroot user with workload-ca serve as its
// command, and its binary is static (the image has no libc) and works: it
// serves as the CA against the real apiserver and issues a certificate.
func TestImage(t *testing.T) {
	dir := os.Getenv("WORKLOAD_CA_IMAGE_LAYOUT")
	if dir == "" {
		t.Fatal("WORKLOAD_CA_IMAGE_LAYOUT is not set: make e2e builds the image (make image) and sets it")
	}
	img := hostImage(t, dir)
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.Config; c.User != "65532:65532" || len(c.Entrypoint) != 1 || strings.Join(c.Cmd, " ") != "serve" {
		t.Errorf("image config: user %q, entrypoint %v, cmd %v", c.User, c.Entrypoint, c.Cmd)
	}
	bin := extractFile(t, img, strings.TrimPrefix(cfg.Config.Entrypoint[0], "/"))
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("the image's binary needs a dynamic loader; the image has none")
		}
	}
	_ = f.Close()
	t.Run("named as the chart installs it", func(t *testing.T) { checkImageRef(t, dir) })
	t.Run("its SBOM lists every module in the binary", func(t *testing.T) { checkSBOM(t, bin) })
	t.Run("built with the Makefile's pinned Go, as make build's binary is", func(t *testing.T) {
		checkToolchain(t, bin, os.Getenv(cahost.EnvBinary))
	})
	out, err := exec.CommandContext(t.Context(), bin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "workload-ca ") {
		t.Fatalf("version: %v: %s", err, out)
	}

	f2 := newLCFixture(t, "image")
	ca, err := cahost.Start(t.Context(), cahost.Options{Binary: bin, Kubeconfig: f2.s.cp.KubeconfigPath(),
		WorkDir: filepath.Join(f2.dir, "ca"), ExtraArgs: f2.args(false)})
	if err != nil {
		t.Fatal(err)
	}
	f2.stopAtCleanup(t, ca)
	rootPEM, err := os.ReadFile(ca.RootCertPath())
	if err != nil {
		t.Fatal(err)
	}
	roots, err := pemCerts(rootPEM)
	if err != nil || len(roots) != 1 {
		t.Fatalf("root-cert.pem: %d certificates, %v", len(roots), err)
	}
	res := requestFrom(t, ca, f2.s.ztunnelA, id("demo", "web"))
	if err := verifiesWith(res.Leaf, res.Chain, roots, time.Now()); err != nil {
		t.Fatalf("leaf from the image's CA does not verify: %v", err)
	}
}

// hostImage returns the image for this machine's platform from the OCI
// layout at dir, whose index.json names one image index.
func hostImage(t *testing.T, dir string) v1.Image {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil || len(tm.Manifests) != 1 {
		t.Fatalf("index.json: %v, %v; want one image index", tm, err)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	want := v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH}
	for _, d := range m.Manifests {
		if d.Platform != nil && d.Platform.Equals(want) {
			img, err := idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			return img
		}
	}
	t.Fatalf("no image for %s in %s", want.String(), dir)
	return nil
}

// extractFile writes the file at name (no leading slash) of img's
// filesystem to a temporary executable and returns its path.
func extractFile(t *testing.T, img v1.Image, name string) string {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("%s is not in the image", name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != name {
			continue
		}
		path := filepath.Join(t.TempDir(), filepath.Base(name))
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		return path
	}
}

// checkImageRef: the layout's index is named (HUB/workload-ca:TAG) what
// the chart's default values install.
func checkImageRef(t *testing.T, dir string) {
	index, err := os.ReadFile(filepath.Join(dir, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m v1.IndexManifest
	if err := json.Unmarshal(index, &m); err != nil || len(m.Manifests) != 1 {
		t.Fatalf("index.json: %v, %d manifests", err, len(m.Manifests))
	}
	ref := m.Manifests[0].Annotations["org.opencontainers.image.ref.name"]
	objs := renderChart(t, helmBinary(t), "wca", "default", serverVersion(t, suiteFor(t)))
	c := container(t, findObject(t, objs, "Deployment"))
	if c["image"] != ref {
		t.Errorf("the image is %q, the chart installs %q by default", ref, c["image"])
	}
}

// checkSBOM: the CycloneDX SBOM make image wrote beside the image names
// every module the binary was built from, at the version built.
func checkSBOM(t *testing.T, bin string) {
	path := os.Getenv("WORKLOAD_CA_IMAGE_SBOM")
	if path == "" {
		t.Fatal("WORKLOAD_CA_IMAGE_SBOM is not set: make e2e sets it to the SBOM make image writes")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var sbom struct {
		BOMFormat  string `json:"bomFormat"`
		Components []struct {
			Name, Version string
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &sbom); err != nil || sbom.BOMFormat != "CycloneDX" {
		t.Fatalf("%s: %v, format %q", path, err, sbom.BOMFormat)
	}
	listed := map[string]string{}
	for _, c := range sbom.Components {
		listed[c.Name] = c.Version
	}
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		if listed[d.Path] != d.Version {
			t.Errorf("module %s %s: the SBOM lists %q", d.Path, d.Version, listed[d.Path])
		}
	}
	if len(info.Deps) < 50 {
		t.Errorf("the binary names %d modules; is it the image's?", len(info.Deps))
	}
}

// checkToolchain checks that every binary named was built with the Go
// release the Makefile pins (GOTOOLCHAIN), and so is this test: a machine
// that built with its own Go would ship the standard library's fixed
// vulnerabilities again.
func checkToolchain(t *testing.T, bins ...string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var pinned string
	for line := range strings.Lines(string(raw)) {
		if v, ok := strings.CutPrefix(line, "export GOTOOLCHAIN := "); ok {
			pinned = strings.TrimSpace(v)
		}
	}
	if !strings.HasPrefix(pinned, "go1.") {
		t.Fatalf("the Makefile pins no Go toolchain (export GOTOOLCHAIN := go1...): %q", pinned)
	}
	if runtime.Version() != pinned {
		t.Errorf("the e2e suite was built with %s, the Makefile pins %s", runtime.Version(), pinned)
	}
	for _, bin := range bins {
		info, err := buildinfo.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if info.GoVersion != pinned {
			t.Errorf("%s was built with %s, the Makefile pins %s", bin, info.GoVersion, pinned)
		}
	}
}
