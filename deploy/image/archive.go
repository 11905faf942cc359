package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations on the image's entry in index.json. containerd names an
// imported image from the first; the OCI one holds the tag, as docker save
// writes it.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// writeFile writes the archive to path through a temporary file in the
// same directory, so a failed build leaves no half-written archive.
func writeFile(path string, img v1.Image, m meta) (err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".gozt-image-*.tar")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := writeArchive(f, img, m); err != nil {
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// writeArchive writes img as an OCI image layout with docker's manifest.json
// beside it (package doc, "The archive").
func writeArchive(w io.Writer, img v1.Image, m meta) error {
	index, err := indexJSON(img, m)
	if err != nil {
		return err
	}
	blobs, docker, err := imageBlobs(img, m.ref)
	if err != nil {
		return err
	}
	manifestJSON, err := json.Marshal(docker)
	if err != nil {
		return err
	}
	aw := archiveWriter{tw: tar.NewWriter(w), mtime: m.created}
	aw.dir("blobs/")
	aw.dir("blobs/sha256/")
	for _, b := range blobs {
		aw.file(b.path, b.data)
	}
	aw.file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	aw.file("index.json", index)
	aw.file("manifest.json", manifestJSON)
	if aw.err != nil {
		return aw.err
	}
	return aw.tw.Close()
}

// indexJSON is the layout's index.json: one manifest, for one platform,
// named. (mutate.AppendManifests would also stamp the descriptor with an
// artifactType, which OCI reserves for artifacts that are not images.)
func indexJSON(img v1.Image, m meta) ([]byte, error) {
	desc, err := partial.Descriptor(img)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType:   desc.MediaType,
			Size:        desc.Size,
			Digest:      desc.Digest,
			Platform:    &v1.Platform{OS: "linux", Architecture: m.arch},
			Annotations: map[string]string{annotationContainerdName: m.ref, annotationRefName: m.tag},
		}},
	})
}

type blob struct {
	path string // blobs/sha256/HEX
	data []byte
}

// imageBlobs returns the image's blobs (layers, config, manifest) and the
// docker manifest.json entry that points at them.
func imageBlobs(img v1.Image, ref string) ([]blob, tarball.Manifest, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, nil, err
	}
	entry := tarball.Descriptor{RepoTags: []string{ref}}
	var blobs []blob
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, nil, err
		}
		data, err := readAll(l.Compressed())
		if err != nil {
			return nil, nil, fmt.Errorf("layer %v: %w", d, err)
		}
		blobs = append(blobs, blob{blobPath(d), data})
		entry.Layers = append(entry.Layers, blobPath(d))
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return nil, nil, err
	}
	configName, err := img.ConfigName()
	if err != nil {
		return nil, nil, err
	}
	entry.Config = blobPath(configName)
	manifest, err := img.RawManifest()
	if err != nil {
		return nil, nil, err
	}
	manifestDigest, err := img.Digest()
	if err != nil {
		return nil, nil, err
	}
	blobs = append(blobs, blob{entry.Config, config}, blob{blobPath(manifestDigest), manifest})
	return blobs, tarball.Manifest{entry}, nil
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

func readAll(rc io.ReadCloser, err error) ([]byte, error) {
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// archiveWriter writes tar entries owned by root with one mtime, keeping
// the first error.
type archiveWriter struct {
	tw    *tar.Writer
	mtime time.Time
	err   error
}

func (a *archiveWriter) dir(name string) {
	a.write(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}, nil)
}

func (a *archiveWriter) file(name string, data []byte) {
	a.write(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))}, data)
}

func (a *archiveWriter) write(h *tar.Header, data []byte) {
	if a.err != nil {
		return
	}
	h.ModTime = a.mtime
	if a.err = a.tw.WriteHeader(h); a.err == nil && data != nil {
		_, a.err = io.Copy(a.tw, bytes.NewReader(data))
	}
}
