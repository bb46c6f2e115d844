package wasmtools

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
)

// What a user may grant a tool, checked against what its manifest
// requests (Tool.Requests) when it is installed or granted more.

// CarryGrants returns those of g, given to an earlier module, that a
// module requesting req still requests: read-only where the request now
// is.
func CarryGrants(req, g capabilities.Grants) capabilities.Grants {
	var out capabilities.Grants
	for _, f := range g.FS {
		i := slices.IndexFunc(req.FS, func(r capabilities.FSGrant) bool { return path.Clean("/"+r.GuestPath) == f.GuestPath })
		if i < 0 {
			continue
		}
		f.ReadOnly = f.ReadOnly || req.FS[i].ReadOnly
		out.FS = append(out.FS, f)
	}
	for _, n := range g.Network {
		if slices.ContainsFunc(req.Network, func(r string) bool { return capabilities.PatternCovers(r, n) }) {
			out.Network = append(out.Network, n)
		}
	}
	for _, e := range g.Env {
		if slices.Contains(req.Env, e) {
			out.Env = append(out.Env, e)
		}
	}
	out.Limits = CarryLimits(req.Limits, g.Limits)
	return out
}

// CheckGrants returns g normalized if it grants only what req requests:
// a filesystem grant names a requested guest path and an existing host
// directory, and is read-only where the request is; its labels are
// label names (keel.CheckLabel), kept sorted without duplicates,
// "private" as Private; network and
// environment grants name requested entries exactly; a limit grant names
// a limit the manifest asks for. Anything else is refused, naming the
// offending entry, with an error wrapping keel.ErrInvalid.
func CheckGrants(req, g capabilities.Grants) (capabilities.Grants, error) {
	var out capabilities.Grants
	for _, f := range g.FS {
		guest := path.Clean("/" + f.GuestPath)
		i := slices.IndexFunc(req.FS, func(r capabilities.FSGrant) bool { return path.Clean("/"+r.GuestPath) == guest })
		if i < 0 {
			return out, fmt.Errorf("grant fs:%s: the tool does not request it: %w", guest, keel.ErrInvalid)
		}
		if !filepath.IsAbs(f.HostPath) {
			return out, fmt.Errorf("grant fs:%s: host path %q must be absolute: %w", guest, f.HostPath, keel.ErrInvalid)
		}
		switch fi, err := os.Stat(f.HostPath); {
		case errors.Is(err, fs.ErrNotExist):
			return out, fmt.Errorf("grant fs:%s: host directory %s does not exist; create it first (mkdir -p %s): %w", guest, f.HostPath, f.HostPath, keel.ErrInvalid)
		case err != nil:
			return out, fmt.Errorf("grant fs:%s: host directory %s: %w: %w", guest, f.HostPath, err, keel.ErrInvalid)
		case !fi.IsDir():
			return out, fmt.Errorf("grant fs:%s: host path %s is not a directory: %w", guest, f.HostPath, keel.ErrInvalid)
		}
		labelled, err := capabilities.FSGrant{HostPath: filepath.Clean(f.HostPath), GuestPath: guest, ReadOnly: f.ReadOnly || req.FS[i].ReadOnly, Private: f.Private}.WithLabels(f.Labels...)
		if err != nil {
			return out, fmt.Errorf("grant fs:%s: %w: %w", guest, err, keel.ErrInvalid)
		}
		out.FS = append(out.FS, labelled)
	}
	for _, n := range g.Network {
		if !slices.ContainsFunc(req.Network, func(r string) bool { return capabilities.PatternCovers(r, n) }) {
			return out, fmt.Errorf("grant net:%s: the tool does not request it: %w", n, keel.ErrInvalid)
		}
		out.Network = append(out.Network, n)
	}
	for _, e := range g.Env {
		if !slices.Contains(req.Env, e) {
			return out, fmt.Errorf("grant env:%s: the tool does not request it: %w", e, keel.ErrInvalid)
		}
		out.Env = append(out.Env, e)
	}
	if err := g.Limits.Check(); err != nil {
		return out, fmt.Errorf("grant: %w: %w", err, keel.ErrInvalid)
	}
	for _, f := range []struct {
		kind      string
		req, gave int64
	}{
		{"timeout", req.Limits.TimeoutMS, g.Limits.TimeoutMS},
		{"memory", req.Limits.MemoryMiB, g.Limits.MemoryMiB},
		{"output", req.Limits.OutputBytes, g.Limits.OutputBytes},
		{"write_quota", req.Limits.WriteQuotaBytes, g.Limits.WriteQuotaBytes},
	} {
		if f.gave != 0 && f.req == 0 {
			return out, fmt.Errorf("grant limit:%s: the tool's manifest does not ask for a %s limit: %w", f.kind, f.kind, keel.ErrInvalid)
		}
	}
	out.Limits = g.Limits
	return out, nil
}

// CarryLimits returns the limits of g that req asks for.
func CarryLimits(req, g capabilities.Limits) capabilities.Limits {
	keep := func(r, v int64) int64 {
		if r == 0 {
			return 0
		}
		return v
	}
	return capabilities.Limits{
		TimeoutMS:       keep(req.TimeoutMS, g.TimeoutMS),
		MemoryMiB:       keep(req.MemoryMiB, g.MemoryMiB),
		OutputBytes:     keep(req.OutputBytes, g.OutputBytes),
		WriteQuotaBytes: keep(req.WriteQuotaBytes, g.WriteQuotaBytes),
	}
}
