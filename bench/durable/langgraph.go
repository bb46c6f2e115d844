package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// lgResult is the JSON object bench.mjs prints.
type lgResult struct {
	Versions    map[string]string `json:"versions"`
	JournalMode string            `json:"journal_mode"`
	Synchronous string            `json:"synchronous"`
	Durability  string            `json:"durability"`
	N           int               `json:"n"`
	Single      *struct {
		TotalMS   float64 `json:"total_ms"`
		MSPerStep float64 `json:"ms_per_step"`
	} `json:"single"`
	Transactions *struct {
		CommitsPerStep    float64 `json:"commits_per_step"`
		StatementsPerStep float64 `json:"statements_per_step"`
		CheckpointRows    int     `json:"checkpoint_rows"`
		WriteRows         int     `json:"write_rows"`
	} `json:"transactions"`
	Concurrent []struct {
		C         int     `json:"c"`
		Steps     int     `json:"steps"`
		TotalMS   float64 `json:"total_ms"`
		StepsPerS float64 `json:"steps_per_s"`
	} `json:"concurrent"`
}

// installLangGraph runs npm ci in dir unless a complete install is there
// (npm writes node_modules/.package-lock.json last). npm's output,
// including the build of better-sqlite3, goes to stderr.
func installLangGraph(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "package-lock.json")); err != nil {
		return fmt.Errorf("the LangGraph.js benchmark is not at %s (run from the repository root, or set -langgraph): %w", dir, err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		return fmt.Errorf("node is needed for LangGraph.js (or pass -skip-langgraph): %w", err)
	}
	_, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json"))
	if err == nil {
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	fmt.Fprintf(os.Stderr, "durable: installing the LangGraph.js benchmark's packages in %s (npm ci; building better-sqlite3 takes a few minutes)\n", dir)
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--foreground-scripts")
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("npm ci in %s: %w", dir, err)
	}
	return nil
}

// runLangGraph runs bench.mjs in lgDir on files in dir and parses what it
// prints. single asks for the one-run figures too.
func runLangGraph(lgDir, dir, synchronous string, n int, conc []int, single bool) (lgResult, error) {
	cs := make([]string, len(conc))
	for i, c := range conc {
		cs[i] = strconv.Itoa(c)
	}
	args := []string{"bench.mjs", "--dir", dir, "--sync", synchronous, "--n", strconv.Itoa(n), "--c", strings.Join(cs, ",")}
	if !single {
		args = append(args, "--skip-single")
	}
	cmd := exec.Command("node", args...)
	var out bytes.Buffer
	cmd.Dir, cmd.Stdout, cmd.Stderr = lgDir, &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return lgResult{}, fmt.Errorf("node %s: %w", strings.Join(args, " "), err)
	}
	var res lgResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return lgResult{}, fmt.Errorf("bench.mjs printed %q: %w", out.String(), err)
	}
	if res.Synchronous != synchronous || res.JournalMode != "wal" {
		return lgResult{}, fmt.Errorf("bench.mjs ran with journal_mode %s, synchronous %s; want wal, %s", res.JournalMode, res.Synchronous, synchronous)
	}
	if single && (res.Single == nil || res.Transactions == nil) {
		return lgResult{}, fmt.Errorf("bench.mjs printed no one-run figures: %s", out.String())
	}
	if len(res.Concurrent) != len(conc) {
		return lgResult{}, fmt.Errorf("bench.mjs printed %d concurrent figures, want %d", len(res.Concurrent), len(conc))
	}
	return res, nil
}
