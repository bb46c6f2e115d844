// Package dbtest gives tests a new keel database file with every
// migration already applied, copied from a template made once per test
// process. Applying the migrations to each new file (fifteen of the
// store's, each its own transaction, and the knowledge store's tables)
// cost about 0.3 s of CPU a database under -race, and the daemon's and
// engine's tests make a new database in nearly every test: some 15% of
// the daemon package's CPU. The template is what a daemon's first start
// leaves: the store's and the knowledge store's tables, empty. Only tests
// use this package; tests of the migrations themselves (store's) start
// from an empty file.
package dbtest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/keel-runtime/keel/knowledge"
	"github.com/keel-runtime/keel/store"
)

// DBFile is the database's file name in a data directory.
const DBFile = "keel.db"

var template struct {
	once sync.Once
	body []byte
	err  error
}

// Seed writes a new migrated, empty database to path, which must not
// exist (fs.ErrExist otherwise). The file is in WAL mode, as the store
// leaves it; a store opened on it finds nothing to migrate.
func Seed(path string) error {
	template.once.Do(func() { template.body, template.err = makeTemplate() })
	if template.err != nil {
		return fmt.Errorf("dbtest: template: %w", template.err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("dbtest: %w", err)
	}
	_, err = f.Write(template.body)
	return errors.Join(err, f.Close())
}

// SeedDataDir seeds dir's database (DBFile) when dir exists and holds
// none yet; otherwise it does nothing: a daemon creates its data
// directory itself, and one given a database keeps it.
func SeedDataDir(dir string) error {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil
	}
	err := Seed(filepath.Join(dir, DBFile))
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	return err
}

// makeTemplate migrates a database in a temporary directory as a
// daemon's first start does (the store, then the knowledge store on the
// same file), closes it (which checkpoints and removes the WAL) and
// returns the file's bytes.
func makeTemplate() ([]byte, error) {
	dir, err := os.MkdirTemp("", "keel-dbtest-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, DBFile)
	ctx := context.Background()
	st, err := store.OpenWith(ctx, path, store.Options{Synchronous: "NORMAL"})
	if err != nil {
		return nil, err
	}
	ix, err := knowledge.Open(ctx, path, knowledge.Options{})
	if err != nil {
		st.Close()
		return nil, err
	}
	if err := errors.Join(ix.Close(), st.Close()); err != nil {
		return nil, err
	}
	if _, err := os.Stat(path + "-wal"); err == nil {
		return nil, errors.New("the write-ahead log was left after the last close")
	}
	return os.ReadFile(path)
}
