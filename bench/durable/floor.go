package main

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"slices"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver, the one store uses
)

// floorResult is the cost of one SQLite commit on this disk: the least a
// durable step can cost when it is one transaction of its own.
type floorResult struct {
	commits   int
	p50, mean time.Duration
	sqlite    string // SQLite's version
}

// floorDB is a fresh database file opened as store opens its own
// (modernc.org/sqlite, WAL, the given synchronous setting, BEGIN
// IMMEDIATE, one connection) with one table, for timing bare commits.
type floorDB struct {
	db     *sql.DB
	row    []byte
	sqlite string // SQLite's version
}

func openFloor(ctx context.Context, dir, synchronous string) (*floorDB, error) {
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(" + synchronous + ")"} {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate")
	path := filepath.Join(dir, "floor-"+synchronous+".db")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	// About the size of a journaled event.
	f := &floorDB{db: db, row: make([]byte, 200)}
	var sync int
	if err := db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&f.sqlite); err != nil {
		db.Close()
		return nil, err
	}
	if err := db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil {
		db.Close()
		return nil, err
	}
	if want := map[string]int{"NORMAL": 1, "FULL": 2}[synchronous]; sync != want {
		db.Close()
		return nil, fmt.Errorf("synchronous is %d, want %d (%s)", sync, want, synchronous)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (id INTEGER PRIMARY KEY, data BLOB)`); err != nil {
		db.Close()
		return nil, err
	}
	if _, err := f.commits(ctx, warmCommits); err != nil { // untimed: see warmCommits
		db.Close()
		return nil, err
	}
	return f, nil
}

func (f *floorDB) Close() error { return f.db.Close() }

// commits makes n single-row INSERT transactions and times each.
func (f *floorDB) commits(ctx context.Context, n int) ([]time.Duration, error) {
	commit := func() error {
		tx, err := f.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO t (data) VALUES (?)`, f.row); err != nil {
			return err
		}
		return tx.Commit()
	}
	d := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := commit(); err != nil {
			return nil, err
		}
		d = append(d, time.Since(start))
	}
	return d, nil
}

// measure times n commits.
func (f *floorDB) measure(ctx context.Context, n int) (floorResult, error) {
	d, err := f.commits(ctx, n)
	if err != nil {
		return floorResult{}, err
	}
	return floorResult{commits: n, p50: median(d), mean: mean(d), sqlite: f.sqlite}, nil
}

func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

func mean(d []time.Duration) time.Duration {
	var total time.Duration
	for _, x := range d {
		total += x
	}
	return total / time.Duration(len(d))
}
