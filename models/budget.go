package models

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// Limits caps spending; a zero field is no limit.
type Limits struct {
	Tokens  int64   `json:"tokens,omitempty"`
	CostUSD float64 `json:"usd,omitempty"`
}

// Unlimited reports whether l caps nothing.
func (l Limits) Unlimited() bool { return l.Tokens <= 0 && l.CostUSD <= 0 }

// Budget tracks spending against Limits. A call reserves its worst case
// before it is sent and settles what it really spent afterwards, so that
// concurrent calls can never overspend together. It is safe for
// concurrent use.
type Budget struct {
	name   string
	limits Limits

	mu                    sync.Mutex
	spentTok, reservedTok int64
	spentUSD, reservedUSD float64
}

// NewBudget returns a budget called name (for messages: "run", "day")
// with the given limits, of which spent is already used.
func NewBudget(name string, limits Limits, spentTokens int64, spentUSD float64) *Budget {
	return &Budget{name: name, limits: limits, spentTok: spentTokens, spentUSD: spentUSD}
}

// Spent returns what settled calls spent.
func (b *Budget) Spent() (tokens int64, usd float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.spentTok, b.spentUSD
}

// Limits returns the budget's limits.
func (b *Budget) Limits() Limits { return b.limits }

// Left returns how many tokens and dollars are neither spent nor
// reserved; -1 means unlimited.
func (b *Budget) Left() (tokens int64, usd float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.leftLocked()
}

func (b *Budget) leftLocked() (tokens int64, usd float64) {
	tokens, usd = -1, -1
	if b.limits.Tokens > 0 {
		tokens = max(0, b.limits.Tokens-b.spentTok-b.reservedTok)
	}
	if b.limits.CostUSD > 0 {
		usd = max(0, b.limits.CostUSD-b.spentUSD-b.reservedUSD)
	}
	return tokens, usd
}

// Reservation is spending held for one call until it settles.
type Reservation struct {
	budgets []*Budget
	tokens  int64
	usd     float64
	done    bool
}

// Reserve holds tokens and usd on every budget in bs (nil entries are
// skipped), all or nothing. It fails with an *Error of KindBudget naming
// the budget that has not enough left.
func Reserve(tokens int64, usd float64, bs ...*Budget) (*Reservation, error) {
	r := &Reservation{tokens: tokens, usd: usd}
	for _, b := range bs {
		if b == nil {
			continue
		}
		if err := b.reserve(tokens, usd); err != nil {
			r.Settle(0, 0)
			return nil, err
		}
		r.budgets = append(r.budgets, b)
	}
	return r, nil
}

func (b *Budget) reserve(tokens int64, usd float64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	leftTok, leftUSD := b.leftLocked()
	switch {
	case leftTok >= 0 && tokens > leftTok:
		return &Error{Kind: KindBudget, Msg: fmt.Sprintf("the %s budget has %d of %d tokens left and this call may need %d; raise the limit or shorten the request", b.name, leftTok, b.limits.Tokens, tokens)}
	case leftUSD >= 0 && usd > leftUSD:
		return &Error{Kind: KindBudget, Msg: fmt.Sprintf("the %s budget has %s of %s left and this call may cost %s; raise the limit or use a local model", b.name, FormatUSD(leftUSD), FormatUSD(b.limits.CostUSD), FormatUSD(usd))}
	}
	b.reservedTok += tokens
	b.reservedUSD += usd
	return nil
}

// Settle releases the reservation and charges what the call spent. Only
// the first call has an effect.
func (r *Reservation) Settle(tokens int64, usd float64) {
	if r == nil || r.done {
		return
	}
	r.done = true
	for _, b := range r.budgets {
		b.mu.Lock()
		b.reservedTok -= r.tokens
		b.reservedUSD -= r.usd
		b.spentTok += tokens
		b.spentUSD += usd
		b.mu.Unlock()
	}
}

// FormatUSD renders an amount of US dollars for people: cents when it is
// a whole number of cents ("$5.00", "$0.10"), else as many decimals as it
// takes, up to six ("$0.0001", "$0.000123"), so that a small budget is
// never shown as "$0.00".
func FormatUSD(v float64) string {
	s := strings.TrimRight(strconv.FormatFloat(v, 'f', 6, 64), "0")
	if dot := strings.IndexByte(s, '.'); len(s)-dot < 3 {
		s += strings.Repeat("0", 3-(len(s)-dot))
	}
	return "$" + s
}
