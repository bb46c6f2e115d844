package edge

import (
	"slices"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/capabilities"
	"github.com/keel-runtime/keel/cloud/route"
)

// Declare makes the declaration an edge named name publishes from what
// its env.describe says: its tools with the labels their grants give
// their output, the models of its providers that answer, and the labels
// it may hold (those of its grants and MCP servers). Host paths, URLs
// and the data directory are not declared: they are the edge's own.
func Declare(name string, env capabilities.Environment) route.Env {
	d := route.Env{Name: name, Kind: route.KindEdge, Version: env.Version}
	var labels []string
	for _, t := range env.Tools {
		var tl []string
		for _, f := range t.Grants.FS {
			tl = keel.UnionLabels(tl, f.AllLabels())
		}
		d.Tools = append(d.Tools, route.Tool{Name: t.Name, SideEffects: t.SideEffects, Labels: tl})
		labels = keel.UnionLabels(labels, tl)
	}
	for _, s := range env.MCPServers {
		labels = keel.UnionLabels(labels, s.Labels)
		for i, t := range d.Tools {
			if slices.Contains(s.Tools, t.Name) {
				d.Tools[i].Labels = keel.UnionLabels(t.Labels, s.Labels)
			}
		}
	}
	for _, p := range env.Providers {
		if !p.Reachable {
			continue
		}
		for _, m := range p.Models {
			d.Models = append(d.Models, route.Model{Name: m.Name, ContextLength: m.ContextLength})
		}
	}
	d.Labels = labels
	return d
}
