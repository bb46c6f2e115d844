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

// measureFloor commits n single-row INSERT transactions into a fresh
// database file in dir, opened as store opens its own (modernc.org/sqlite,
// WAL, the given synchronous setting, BEGIN IMMEDIATE, one connection),
// after 50 untimed ones, and times each commit.
func measureFloor(ctx context.Context, dir, synchronous string, n int) (floorResult, error) {
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(" + synchronous + ")"} {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate")
	path := filepath.Join(dir, "floor-"+synchronous+".db")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return floorResult{}, fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)

	var res floorResult
	var sync int
	if err := db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&res.sqlite); err != nil {
		return floorResult{}, err
	}
	if err := db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil {
		return floorResult{}, err
	}
	if want := map[string]int{"NORMAL": 1, "FULL": 2}[synchronous]; sync != want {
		return floorResult{}, fmt.Errorf("synchronous is %d, want %d (%s)", sync, want, synchronous)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (id INTEGER PRIMARY KEY, data BLOB)`); err != nil {
		return floorResult{}, err
	}
	// About the size of a journaled event.
	row := make([]byte, 200)
	commit := func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO t (data) VALUES (?)`, row); err != nil {
			return err
		}
		return tx.Commit()
	}
	for range 50 {
		if err := commit(); err != nil {
			return floorResult{}, err
		}
	}
	d := make([]time.Duration, 0, n)
	var total time.Duration
	for range n {
		start := time.Now()
		if err := commit(); err != nil {
			return floorResult{}, err
		}
		t := time.Since(start)
		d = append(d, t)
		total += t
	}
	slices.Sort(d)
	res.commits, res.p50, res.mean = n, d[len(d)/2], total/time.Duration(n)
	return res, nil
}
