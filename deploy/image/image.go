package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Paths in the image (package doc, "The image").
const (
	binPath   = "/usr/local/bin/gozt"
	aliasPath = "/usr/local/bin/ztunnel"
)

// build assembles the image: one OCI layer and its config.
func build(m meta) (v1.Image, error) {
	layerBytes, err := layerTar(m.bin, m.created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression),
		tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: m.created},
			CreatedBy: "go run ./deploy/image (gozt " + m.version + ")",
			Comment:   "static gozt at " + binPath + ", " + aliasPath + " -> gozt, /tmp",
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = m.arch
	cf.Created = v1.Time{Time: m.created}
	cf.Config = imageConfig(m)
	return mutate.ConfigFile(img, cf)
}

// imageConfig is how the container runs (package doc, "The image").
func imageConfig(m meta) v1.Config {
	labels := map[string]string{
		"org.opencontainers.image.title":       "gozt",
		"org.opencontainers.image.description": "A wire-compatible Go implementation of Istio's ztunnel",
		"org.opencontainers.image.version":     m.version,
		"org.opencontainers.image.source":      sourceURL,
	}
	if m.revision != "" {
		labels["org.opencontainers.image.revision"] = m.revision
	}
	return v1.Config{
		Entrypoint: []string{binPath},
		Cmd:        []string{"proxy", "ztunnel"},
		WorkingDir: "/",
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels:     labels,
	}
}

// layerTar is the layer's file system as an uncompressed tar, every entry
// owned by root and stamped with mtime so that the layer is reproducible.
func layerTar(bin []byte, mtime time.Time) ([]byte, error) {
	entries := []tar.Header{
		{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777},
		{Typeflag: tar.TypeDir, Name: "usr/", Mode: 0o755},
		{Typeflag: tar.TypeDir, Name: "usr/local/", Mode: 0o755},
		{Typeflag: tar.TypeDir, Name: "usr/local/bin/", Mode: 0o755},
		{Typeflag: tar.TypeReg, Name: binPath[1:], Mode: 0o755, Size: int64(len(bin))},
		{Typeflag: tar.TypeSymlink, Name: aliasPath[1:], Linkname: "gozt", Mode: 0o777},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		h.ModTime = mtime
		if err := tw.WriteHeader(&h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(bin); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
