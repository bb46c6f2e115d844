package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/cloud"
	"github.com/keel-runtime/keel/ipc/protocol"
	"github.com/keel-runtime/keel/models"
)

// ToolSpecs lists tools: engine.Tools's Specs, as a worker's registry
// (wasmtools' RunTools) has it.
type ToolSpecs interface {
	Specs(ctx context.Context) []keel.ToolSpec
}

// ModelLister lists models: a models.Provider's Models.
type ModelLister interface {
	Models(ctx context.Context) ([]models.ModelInfo, error)
}

// catalog serves tools.list and models.list of a tenant: what its
// workers have, within its limits. A tool is called inside a run, on a
// worker; the gateway calls none and pulls no model.
type catalog struct {
	tools  ToolSpecs
	models ModelLister
	limits cloud.Limits
}

func (c catalog) ListTools(ctx context.Context) ([]protocol.ToolInfo, error) {
	out := []protocol.ToolInfo{}
	for _, s := range c.tools.Specs(ctx) {
		if c.limits.Tools == nil || slices.Contains(c.limits.Tools, s.Name) {
			out = append(out, protocol.ToolInfo{ToolSpec: s})
		}
	}
	return out, nil
}

func (catalog) CallTool(context.Context, string, json.RawMessage, string) (json.RawMessage, error) {
	return nil, fmt.Errorf("%w: tools.call is not served by the cloud: a tool runs inside a run, on a worker", keel.ErrUnavailable)
}

func (catalog) ToolsProgress() (loaded, total int, ready bool) { return 0, 0, true }

func (catalog) SubscribeTools(func()) func() { return func() {} }

func (c catalog) ListModels(ctx context.Context) (keel.ModelList, error) {
	ms, err := c.models.Models(ctx)
	list := keel.ModelList{Models: []keel.ModelInfo{}, Providers: []keel.ProviderStatus{{Name: "workers", Reachable: err == nil}}}
	if err != nil {
		list.Providers[0].Error = "the workers' model provider does not answer"
		return list, nil
	}
	for _, m := range ms {
		caps := make([]string, len(m.Capabilities))
		for i, c := range m.Capabilities {
			caps[i] = string(c)
		}
		list.Models = append(list.Models, keel.ModelInfo{Name: m.Name, Provider: m.Provider, Capabilities: caps,
			ContextLength: m.ContextLength, Size: m.Size, Family: m.Family})
	}
	return list, nil
}

func (catalog) PullModel(context.Context, string, func(keel.PullProgress)) error {
	return fmt.Errorf("%w: models.pull is not served by the cloud: the workers' models are their operator's", keel.ErrUnavailable)
}
