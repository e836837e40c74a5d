package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

var created = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// fakeBinaries writes one distinct stand-in binary per platform.
func fakeBinaries(t *testing.T, platforms ...string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	out := map[string]string{}
	for _, p := range platforms {
		path := filepath.Join(dir, strings.ReplaceAll(p, "/", "-"))
		if err := os.WriteFile(path, []byte("\x7fELF workload-ca for "+p), 0o755); err != nil {
			t.Fatal(err)
		}
		out[p] = path
	}
	return out
}

func build(t *testing.T, spec Spec) v1.ImageIndex {
	t.Helper()
	idx, err := Build(spec)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return idx
}

// files lists an image's files: name → header, and the binary's content.
func files(t *testing.T, img v1.Image) (map[string]*tar.Header, []byte) {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v; want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	out := map[string]*tar.Header{}
	var bin []byte
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = h
		if "/"+h.Name == BinaryPath {
			if bin, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	return out, bin
}

func TestBuild(t *testing.T) {
	bins := fakeBinaries(t, "linux/amd64", "linux/arm64")
	idx := build(t, Spec{Binaries: bins, Version: "v1.2.3", Revision: "abc123", Created: created})
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range m.Manifests {
		platforms = append(platforms, d.Platform.String())
	}
	if !slices.Equal(platforms, []string{"linux/amd64", "linux/arm64"}) {
		t.Fatalf("platforms %v", platforms)
	}
	for _, d := range m.Manifests {
		t.Run(d.Platform.String(), func(t *testing.T) {
			img, err := idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			c := cfg.Config
			switch {
			case cfg.OS != d.Platform.OS || cfg.Architecture != d.Platform.Architecture:
				t.Errorf("config platform %s/%s, index says %s", cfg.OS, cfg.Architecture, d.Platform)
			case c.User != "65532:65532":
				t.Errorf("user %q: the chart runs as 65532 and the image must not default to root", c.User)
			case !slices.Equal(c.Entrypoint, []string{BinaryPath}) || !slices.Equal(c.Cmd, []string{"serve"}):
				t.Errorf("entrypoint %v cmd %v", c.Entrypoint, c.Cmd)
			case c.Labels["org.opencontainers.image.version"] != "v1.2.3" || c.Labels["org.opencontainers.image.revision"] != "abc123":
				t.Errorf("labels %v", c.Labels)
			case !cfg.Created.Equal(created):
				t.Errorf("created %v, want %v", cfg.Created.Time, created)
			}
			if _, ok := c.ExposedPorts["15012/tcp"]; !ok {
				t.Errorf("gRPC port not exposed: %v", c.ExposedPorts)
			}
			fs, bin := files(t, img)
			want, _ := os.ReadFile(bins[d.Platform.String()])
			if !bytes.Equal(bin, want) {
				t.Errorf("%s holds %q, want the %s binary", BinaryPath, bin, d.Platform)
			}
			if h := fs[strings.TrimPrefix(BinaryPath, "/")]; h == nil || h.Mode != 0o755 || h.Uid != 0 {
				t.Errorf("binary header %+v: want mode 0755 owned by root (the nonroot user must not be able to replace it)", h)
			}
			if h := fs["etc/passwd"]; h == nil {
				t.Error("no /etc/passwd")
			}
			for name, h := range fs {
				if !h.ModTime.Equal(created) {
					t.Errorf("%s: time %v, want the creation time", name, h.ModTime)
				}
			}
		})
	}
}

// The same binaries and time give the same digest; another binary does not.
func TestBuildIsReproducible(t *testing.T) {
	bins := fakeBinaries(t, "linux/amd64")
	spec := Spec{Binaries: bins, Version: "v1", Created: created}
	a, _ := build(t, spec).Digest()
	b, _ := build(t, spec).Digest()
	if a != b {
		t.Fatalf("two builds: %s and %s", a, b)
	}
	spec.Binaries = fakeBinaries(t, "linux/arm64")
	spec.Binaries["linux/amd64"] = spec.Binaries["linux/arm64"]
	delete(spec.Binaries, "linux/arm64")
	if c, _ := build(t, spec).Digest(); c == a {
		t.Fatal("another binary, same digest")
	}
}

func TestBuildRefuses(t *testing.T) {
	tests := []struct {
		name string
		bins map[string]string
	}{
		{"no binary", nil},
		{"no architecture", map[string]string{"linux": "/bin/true"}},
		{"missing file", map[string]string{"linux/amd64": filepath.Join(t.TempDir(), "absent")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Build(Spec{Binaries: tt.bins, Created: created}); err == nil {
				t.Fatal("built")
			}
		})
	}
}

// run writes the layout and the tarball and pushes to a registry (an
// in-process one, go-containerregistry's); each reads back as the index
// built, by digest.
func TestRunOutputs(t *testing.T) {
	bins := fakeBinaries(t, "linux/amd64", "linux/arm64")
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	u, _ := url.Parse(reg.URL)
	dir := t.TempDir()
	ref := u.Host + "/workload-ca/workload-ca:v9"
	args := []string{"--version", "v9", "--created", "1764590400", "--layout", filepath.Join(dir, "layout"),
		"--tarball", filepath.Join(dir, "image.tar"), "--tarball-platform", "linux/arm64", "--tag", "workload-ca:v9", "--push", ref}
	for p, path := range bins {
		args = append(args, "--binary", p+"="+path)
	}
	var out bytes.Buffer
	if err := run(args, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	want, err := Build(Spec{Binaries: bins, Version: "v9", Created: time.Unix(1764590400, 0).UTC()})
	if err != nil {
		t.Fatal(err)
	}
	wantDigest, _ := want.Digest()

	p, err := layout.FromPath(filepath.Join(dir, "layout"))
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	// Read back from disk, the index, its manifests, configs and layers
	// are consistent (digests, sizes, diff IDs).
	if err := validate.Index(top); err != nil {
		t.Errorf("the layout's index is not valid: %v", err)
	}
	tm, _ := top.IndexManifest()
	if len(tm.Manifests) != 1 || tm.Manifests[0].Digest != wantDigest || tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "workload-ca:v9" {
		t.Errorf("layout index.json %+v, want one index %s named workload-ca:v9 (the --tag)", tm.Manifests, wantDigest)
	}

	tag, _ := name.NewTag("workload-ca:v9")
	img, err := tarball.ImageFromPath(filepath.Join(dir, "image.tar"), &tag)
	if err != nil {
		t.Fatal(err)
	}
	arm, err := imageFor(want, v1.Platform{OS: "linux", Architecture: "arm64"})
	if err != nil {
		t.Fatal(err)
	}
	// docker load's format has Docker media types, so the manifest
	// differs; the config (and through it every layer) is the same.
	gotCfg, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	if wantCfg, _ := arm.ConfigName(); gotCfg != wantCfg {
		t.Errorf("tarball image config %s, want the arm64 image's %s", gotCfg, wantCfg)
	}

	pushed, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Index(pushed)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(pulled); err != nil {
		t.Errorf("the pulled index is not valid: %v", err)
	}
	if got := mustDigest(t, pulled); got != wantDigest {
		t.Errorf("pushed %s, want %s", got, wantDigest)
	}
	if !strings.Contains(out.String(), "pushed "+ref+"@"+wantDigest.String()) {
		t.Errorf("output %q does not name the pushed digest", out.String())
	}
}

func mustDigest(t *testing.T, d interface{ Digest() (v1.Hash, error) }) v1.Hash {
	t.Helper()
	h, err := d.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h
}
