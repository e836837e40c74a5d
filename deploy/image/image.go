// Command image builds the workload-ca container image without a container
// engine: one layer holding the static binary (plus passwd and group
// entries for the nonroot user), on no base image, for each platform, in
// one OCI image index. The same binaries and the same creation time give
// the same digest. It writes an OCI image layout, and can also write a
// tarball for `docker load` / `podman load` and push the index to a
// registry (credentials from the Docker config, as crane and ko read them).
//
//	go run ./deploy/image --version v1.2.3 --created 1700000000 \
//	    --binary linux/amd64=bin/linux-amd64/workload-ca \
//	    --binary linux/arm64=bin/linux-arm64/workload-ca \
//	    --layout bin/image [--tarball bin/image.tar --tag workload-ca:v1.2.3] [--push ghcr.io/org/workload-ca:v1.2.3]
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where things are in the image, and who runs it: the nonroot user of
// distroless images, which the Helm chart's securityContext names too.
const (
	BinaryPath = "/usr/local/bin/workload-ca"
	User       = "65532:65532"
	Source     = "https://github.com/workload-ca/workload-ca"
)

// Spec is what goes into the image.
type Spec struct {
	// Binaries maps a platform ("linux/amd64") to a static workload-ca
	// binary built for it.
	Binaries map[string]string
	Version  string
	// Revision is the source commit (a label).
	Revision string
	// Created is the creation time recorded in the image, and the time of
	// every file: take the commit time for reproducible digests.
	Created time.Time
}

// Build returns the image index of spec, one image per platform.
func Build(spec Spec) (v1.ImageIndex, error) {
	if len(spec.Binaries) == 0 {
		return nil, errors.New("image: no binary")
	}
	platforms := make([]string, 0, len(spec.Binaries))
	for p := range spec.Binaries {
		platforms = append(platforms, p)
	}
	sort.Strings(platforms)
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		plat, err := v1.ParsePlatform(p)
		if err != nil || plat.OS == "" || plat.Architecture == "" {
			return nil, fmt.Errorf("image: platform %q: want os/arch[/variant]", p)
		}
		img, err := buildImage(spec, spec.Binaries[p], plat)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: plat}})
	}
	return idx, nil
}

func buildImage(spec Spec, binary string, plat *v1.Platform) (v1.Image, error) {
	bin, err := os.ReadFile(binary) //nolint:gosec // the binary to package is named by its caller
	if err != nil {
		return nil, err
	}
	layerTar, err := rootFS(bin, spec.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Author: "workload-ca", Created: v1.Time{Time: spec.Created}, CreatedBy: "deploy/image: " + BinaryPath,
	}})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Variant = plat.OS, plat.Architecture, plat.Variant
	cfg.Created = v1.Time{Time: spec.Created}
	cfg.Author = "workload-ca"
	cfg.Config = v1.Config{
		User:       User,
		Entrypoint: []string{BinaryPath},
		Cmd:        []string{"serve"},
		WorkingDir: "/",
		// 15012: gRPC (IstioCertificateService over TLS); 15014: admin.
		ExposedPorts: map[string]struct{}{"15012/tcp": {}, "15014/tcp": {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":    "workload-ca",
			"org.opencontainers.image.source":   Source,
			"org.opencontainers.image.version":  spec.Version,
			"org.opencontainers.image.revision": spec.Revision,
			"org.opencontainers.image.created":  spec.Created.UTC().Format(time.RFC3339),
		},
	}
	return mutate.ConfigFile(img, cfg)
}

// rootFS is the image's only layer: the binary, the nonroot user's passwd
// and group entries (so tools that look the user up find it), and a /tmp.
// Every header is fixed but for the binary, so the layer's digest depends
// on the binary and the time alone.
func rootFS(bin []byte, created time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dir := func(name string, mode int64) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: created, Format: tar.FormatPAX})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: created, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	passwd := "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n" //nolint:gosec // account entries, no password
	group := "root:x:0:\nnonroot:x:65532:\n"
	steps := []func() error{
		func() error { return dir("etc", 0o755) },
		func() error { return file("etc/group", 0o644, []byte(group)) },
		func() error { return file("etc/passwd", 0o644, []byte(passwd)) },
		func() error { return dir("home", 0o755) },
		func() error {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "home/nonroot/", Mode: 0o700, Uid: 65532, Gid: 65532, ModTime: created, Format: tar.FormatPAX})
		},
		func() error { return dir("tmp", 0o1777) },
		func() error { return dir("usr", 0o755) },
		func() error { return dir("usr/local", 0o755) },
		func() error { return dir("usr/local/bin", 0o755) },
		func() error { return file(strings.TrimPrefix(BinaryPath, "/"), 0o755, bin) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
