// Package jsonfile reads the JSON configuration files of the data
// directory (models.json, tools.json) strictly.
package jsonfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Read decodes the JSON object in path into a T. A missing file is the
// zero T; unknown fields and anything after the object are errors naming
// the file and doc, the document that describes it.
func Read[T any](path, doc string) (T, error) {
	var v T
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return v, nil
	}
	if err != nil {
		return v, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return v, fmt.Errorf("%s: %w (see %s)", path, err, doc)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return v, fmt.Errorf("%s: data after its JSON object (see %s)", path, doc)
	}
	return v, nil
}
