package capabilities

import "github.com/keel-runtime/keel"

// ProviderKind is what the model layer knows of a configured provider
// beyond what models.list shows: the name the environment declares it
// under and whether its calls leave the machine.
type ProviderKind struct {
	// Name is the provider's own name ("ollama" for the local one,
	// unless a test's provider); empty: the name it is listed under.
	Name string
	// Cloud marks a provider whose calls leave this machine.
	Cloud bool
}

// DeclareProviders declares the model providers of list (the answer of
// models.list), in its order, each with its models. kinds, keyed by the
// names list uses, says what each is; a provider missing from it is
// declared local under its listed name.
func DeclareProviders(list keel.ModelList, kinds map[string]ProviderKind) []ProviderDecl {
	var out []ProviderDecl
	for _, p := range list.Providers {
		pd := ProviderDecl{Name: p.Name, Kind: "local", Endpoint: p.Endpoint, Reachable: p.Reachable, Error: p.Error, Hint: p.Hint}
		k := kinds[p.Name]
		if k.Cloud {
			pd.Kind = "cloud"
		}
		if k.Name != "" {
			pd.Name = k.Name
		}
		for _, m := range list.Models {
			if m.Provider == p.Name {
				pd.Models = append(pd.Models, ModelDecl{Name: m.Name, Capabilities: m.Capabilities, ContextLength: m.ContextLength})
			}
		}
		out = append(out, pd)
	}
	return out
}
