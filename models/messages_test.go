package models

import (
	"strings"
	"testing"
)

func TestFormatUSD(t *testing.T) {
	tests := []struct {
		v    float64
		want string
	}{
		{0, "$0.00"},
		{5, "$5.00"},
		{0.1, "$0.10"},
		{1.25, "$1.25"},
		{0.0001, "$0.0001"},
		{0.000123, "$0.000123"},
		{0.00000001, "$0.00"},
	}
	for _, tt := range tests {
		if got := FormatUSD(tt.v); got != tt.want {
			t.Errorf("FormatUSD(%v) = %q, want %q", tt.v, got, tt.want)
		}
	}
}

// TestBudgetMessageShowsSmallLimits: a budget of $0.0001 was shown as
// "$0.0001 of $0.00 left".
func TestBudgetMessageShowsSmallLimits(t *testing.T) {
	b := &Budget{name: "run", limits: Limits{CostUSD: 0.0001}}
	err := b.reserve(0, 0.001)
	if err == nil {
		t.Fatal("reserve past the budget = nil, want a budget error")
	}
	if msg := err.Error(); !strings.Contains(msg, "has $0.0001 of $0.0001 left") || !strings.Contains(msg, "may cost $0.001;") {
		t.Errorf("budget error = %q, want the limit and the cost with their digits", msg)
	}
}

// TestErrorWithoutModel: an error of a provider with no model named read
// "ollama : network: …" (a stray space).
func TestErrorWithoutModel(t *testing.T) {
	tests := []struct {
		e    Error
		want string
	}{
		{Error{Kind: KindNetwork, Provider: "ollama", Msg: "down"}, "ollama: network: down"},
		{Error{Kind: KindNotFound, Model: "m", Msg: "gone"}, "m: model_not_found: gone"},
		{Error{Kind: KindNetwork, Provider: "ollama", Model: "m"}, "ollama m: network"},
		{Error{Kind: KindNetwork}, "network"},
	}
	for _, tt := range tests {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("%+v.Error() = %q, want %q", tt.e, got, tt.want)
		}
	}
}
