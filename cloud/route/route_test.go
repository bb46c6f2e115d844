package route

import (
	"errors"
	"fmt"
	"testing"
)

func fleet() []Env {
	return []Env{
		{Name: "cloud", Kind: KindCloud, Tools: []Tool{{Name: "fetch"}, {Name: "summarize"}},
			Models: []Model{{Name: "big-70b", ContextLength: 131072}, {Name: "small-3b", ContextLength: 8192}}, Labels: []string{"pii"}},
		{Name: "laptop", Kind: KindEdge, Tools: []Tool{{Name: "readfile", Labels: []string{"private"}}, {Name: "fetch"}, {Name: "summarize"}},
			Models: []Model{{Name: "small-3b", ContextLength: 8192}}, Labels: []string{"pii", "private"}},
		{Name: "desktop", Kind: KindEdge, Tools: []Tool{{Name: "readfile"}, {Name: "camera"}},
			Models: []Model{{Name: "small-3b", ContextLength: 8192}}, Labels: []string{"private"}, Load: 2},
		{Name: "nas", Kind: KindEdge, Tools: []Tool{{Name: "readfile"}}, Labels: []string{"private"}},
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		need Need
		want string // environment, or "" for ErrNoEnvironment
	}{
		{"large model runs in the cloud", Need{Model: "big-70b", Origin: "laptop"}, "cloud"},
		{"large context runs in the cloud", Need{MinContext: 100000, Origin: "laptop"}, "cloud"},
		{"local-only tool runs on the edge declaring it", Need{Tools: []string{"camera"}, Origin: "laptop"}, "desktop"},
		{"private inputs stay at their origin", Need{Tools: []string{"readfile"}, Labels: []string{"private"}, Origin: "laptop"}, "laptop"},
		{"private inputs with a tool only elsewhere: nowhere", Need{Tools: []string{"camera"}, Labels: []string{"private"}, Origin: "laptop"}, ""},
		{"private inputs and a cloud-only model: nowhere", Need{Model: "big-70b", Labels: []string{"private"}, Origin: "laptop"}, ""},
		{"private inputs of the cloud never reach an edge", Need{Tools: []string{"readfile"}, Labels: []string{"private"}}, ""},
		{"origin first when it can run it", Need{Tools: []string{"fetch"}, Origin: "laptop"}, "laptop"},
		{"then the cloud", Need{Tools: []string{"fetch"}, Origin: "nas"}, "cloud"},
		{"then the least loaded edge", Need{Tools: []string{"readfile"}, Origin: "cloud"}, "laptop"},
		{"a label the cloud may hold", Need{Model: "big-70b", Labels: []string{"pii"}}, "cloud"},
		{"a label no one may hold", Need{Labels: []string{"secret"}}, ""},
		{"the origin holds its own inputs, declared or not", Need{Labels: []string{"secret", "private"}, Origin: "nas"}, "nas"},
		{"an unknown tool", Need{Tools: []string{"teleport"}}, ""},
		{"an unknown model", Need{Model: "huge-400b"}, ""},
		{"a model too small", Need{Model: "small-3b", MinContext: 9000}, ""},
		{"needs nothing: the cloud", Need{}, "cloud"},
		{"edges only: the cloud is passed over", Need{Tools: []string{"fetch"}, Origin: "nas", Kind: KindEdge}, "laptop"},
		{"edges only, the origin can: the origin", Need{Tools: []string{"readfile"}, Origin: "nas", Kind: KindEdge}, "nas"},
		{"edges only, a cloud-only model: nowhere", Need{Model: "big-70b", Origin: "laptop", Kind: KindEdge}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decide(tc.need, fleet())
			if tc.want == "" {
				if !errors.Is(err, ErrNoEnvironment) {
					t.Errorf("Decide(%+v) = %+v, %v; want ErrNoEnvironment", tc.need, got, err)
				}
				return
			}
			if err != nil || got.Env != tc.want || got.Reason == "" {
				t.Errorf("Decide(%+v) = %+v, %v; want %s with a reason", tc.need, got, err, tc.want)
			}
		})
	}
}

func TestTablePutRemove(t *testing.T) {
	t.Parallel()
	tab := NewTable(fleet()...)
	if d, err := tab.Decide(Need{Tools: []string{"camera"}}); err != nil || d.Env != "desktop" {
		t.Fatalf("Decide(camera) = %+v, %v; want desktop", d, err)
	}
	tab.Remove("desktop")
	if d, err := tab.Decide(Need{Tools: []string{"camera"}}); !errors.Is(err, ErrNoEnvironment) {
		t.Errorf("Decide(camera) after desktop left = %+v, %v; want ErrNoEnvironment", d, err)
	}
	// A new declaration replaces the old one: the tool it no longer
	// declares is no longer found there.
	tab.Put(Env{Name: "laptop", Kind: KindEdge, Tools: []Tool{{Name: "camera"}}})
	if d, err := tab.Decide(Need{Tools: []string{"camera"}}); err != nil || d.Env != "laptop" {
		t.Errorf("Decide(camera) after laptop's new declaration = %+v, %v; want laptop", d, err)
	}
	if d, err := tab.Decide(Need{Tools: []string{"readfile"}, Labels: []string{"private"}, Origin: "laptop"}); !errors.Is(err, ErrNoEnvironment) {
		t.Errorf("Decide(readfile) on laptop after it dropped readfile = %+v, %v; want ErrNoEnvironment", d, err)
	}
	if n := tab.Len(); n != 3 {
		t.Errorf("Len() = %d, want 3", n)
	}
}

// thousand is a cloud and 1,000 edges, each with a tool of its own and
// a shared one.
func thousand() *Table {
	envs := []Env{{Name: "cloud", Kind: KindCloud, Models: []Model{{Name: "big-70b", ContextLength: 131072}}}}
	for i := range 1000 {
		envs = append(envs, Env{Name: fmt.Sprintf("edge-%04d", i), Kind: KindEdge, Load: i % 7,
			Tools:  []Tool{{Name: "readfile"}, {Name: fmt.Sprintf("local-%d", i)}},
			Models: []Model{{Name: "small-3b", ContextLength: 8192}}, Labels: []string{"private"}})
	}
	return NewTable(envs...)
}

func BenchmarkDecide(b *testing.B) {
	tab := thousand()
	needs := []Need{
		{Tools: []string{"local-500"}},
		{Model: "big-70b", Origin: "edge-0001"},
		{Tools: []string{"readfile"}, Labels: []string{"private"}, Origin: "edge-0999"},
		{Tools: []string{"readfile"}},
	}
	for _, n := range needs {
		if _, err := tab.Decide(n); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		tab.Decide(needs[i%len(needs)])
	}
}
