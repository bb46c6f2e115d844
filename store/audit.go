package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/intercept"
	"github.com/keel-runtime/keel/internal/logkey"
)

// RecordToolCall appends one record to the tool audit trail and returns
// its ID once it is on disk.
func (s *Store) RecordToolCall(ctx context.Context, a keel.ToolAudit) (int64, error) {
	return s.recordToolCall(ctx, a, false)
}

// recordToolCall appends a to the audit trail and returns its ID once it
// is committed: synced (on disk) unless unsynced, then in the WAL only
// (see writer.synced).
func (s *Store) recordToolCall(ctx context.Context, a keel.ToolAudit, unsynced bool) (int64, error) {
	ins, err := auditInsert(a)
	if err != nil {
		return 0, err
	}
	var id int64
	err = s.wr.writeOp(ctx, op{fn: func(ctx context.Context, tx *wtx) error {
		res, err := ins(ctx, tx)
		if err != nil {
			return err
		}
		id, err = res.LastInsertId()
		return err
	}, atomic: true, unsynced: unsynced}, carryNone)
	if err != nil {
		return 0, fmt.Errorf("record tool call %s: %w", a.Tool, mapErr(err))
	}
	return id, nil
}

// queueToolCall appends one record to the tool audit trail with the
// next write of any kind, in that write's transaction (or within
// lazyDelay if none comes), without an fsync of its own. An error
// committing it goes to Options.OnLazyError.
func (s *Store) queueToolCall(a keel.ToolAudit) error {
	ins, err := auditInsert(a)
	if err != nil {
		return err
	}
	s.wr.writeNext(func(ctx context.Context, tx *wtx) error {
		if _, err := ins(ctx, tx); err != nil {
			return fmt.Errorf("record tool call %s: %w", a.Tool, mapErr(err))
		}
		return nil
	})
	return nil
}

// AuditTrail is the tool interceptor that records every call, from a run
// or direct, allowed or denied, in the store's audit trail (ToolCalls):
// the tool's version, digest and grants, who called it, a digest of its
// arguments, the outcome and the duration, the policy's decision, the
// labels of its output, the hosts it reached and the requests the policy
// refused. The calls a decision kept from the tools, which no
// interceptor sees, it records through ToolDenied (engine.DeniedCalls). Put it first in the chain, so
// it records the decision of every interceptor after it.
//
// Durability: a direct call's record is committed before the call
// returns to its caller. It is on disk (synced) then, unless the tool
// that ran declares itself read-only (o.Build.SideEffects is
// keel.SideEffectReadOnly) and the call reached no network host (nor
// had a request refused): such a call's record is committed without an
// fsync of its own, at synchronous=NORMAL (see Options.Synchronous).
// It is in the WAL when the call returns, so it survives a crash or kill
// of keel; only a crash of the machine or a power cut before the next
// synced commit (a run's step, another call's synced record, any write)
// or checkpoint can lose it, and then only it: the WAL is written in
// order, so every later synced commit carries it to the disk. A call
// that changes nothing outside itself leaves nothing unaccounted for
// when its record is lost that way; a call that may (any other class,
// or none declared) keeps its synced record, as does a denied call. The
// fsync was most of such a call's time (docs/PERFORMANCE.md, issue 18).
// A run's call's record commits in the transaction of the
// store's next write of any kind (or on its own within lazyDelay if none
// comes), without an fsync of its own. AfterTool runs before the call
// returns, and the engine journals a call's result with a write of this
// store after it returns, so a journaled result always has its audit
// record on disk: the record commits in the same transaction as the
// result, or in an earlier one. A crash before that loses the record
// with the result (the run's resume then decides the call again), never
// one without the other. A record that cannot be written is logged, not
// hidden: the call happened.
//
// An AuditTrail is safe for concurrent use; it denies nothing.
type AuditTrail struct {
	s   *Store
	log *slog.Logger
}

// AuditTrail returns the audit interceptor writing to s; log (nil:
// discard) receives the records it could not write.
func (s *Store) AuditTrail(log *slog.Logger) *AuditTrail {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &AuditTrail{s: s, log: log}
}

// BeforeTool allows every call.
func (*AuditTrail) BeforeTool(context.Context, keel.ToolInvocation) intercept.Decision {
	return intercept.Decision{}
}

// AfterTool records the call (see AuditTrail): with the policy's
// decision that let it run (inv.Policy), and from what it touched
// (inv.Touched, when set) the labels of its output (inv.LabelsOf, or
// the host's), the hosts it reached or tried and the requests the
// policy refused.
func (a *AuditTrail) AfterTool(ctx context.Context, inv keel.ToolInvocation, _ intercept.Decision, o intercept.ToolOutcome) {
	rec := auditRecord(inv, o.Start)
	rec.Version, rec.SHA256, rec.Grants, rec.Duration = o.Build.Version, o.Build.SHA256, o.Build.Grants, o.Duration
	if o.Err != nil {
		rec.Outcome, rec.Error = string(o.Err.Code), o.Err.Error()
	}
	if t := inv.Touched; t != nil {
		rec.Hosts, rec.Refused, rec.Labels = t.Hosts, t.Refused, t.Labels
		if inv.LabelsOf != nil {
			rec.Labels = inv.LabelsOf(t)
		}
	}
	a.record(ctx, inv, rec, o.Build.SideEffects == keel.SideEffectReadOnly && len(rec.Hosts)+len(rec.Refused) == 0)
}

// ToolDenied records a call a decision kept from the tools (the
// policy denied it, or a person did; the interceptors never see it):
// err's code (policy_denied, denied) is its outcome, with err's message
// and the decision (inv.Policy). Its durability is that of AfterTool's record: a run's
// call's commits with the store's next write, the journaled result.
func (a *AuditTrail) ToolDenied(ctx context.Context, inv keel.ToolInvocation, err *keel.ToolError) {
	rec := auditRecord(inv, time.Now())
	rec.Outcome, rec.Error = string(err.Code), err.Error()
	a.record(ctx, inv, rec, false)
}

// auditRecord is the record of inv started at start, outcome ok.
func auditRecord(inv keel.ToolInvocation, start time.Time) keel.ToolAudit {
	sum := sha256.Sum256(inv.Args)
	return keel.ToolAudit{Time: start.UTC(), Tool: inv.Name, RunID: inv.Run, Step: inv.Step, CallID: inv.CallID,
		Client: inv.Client, ArgsSHA256: hex.EncodeToString(sum[:]), Outcome: "ok", Policy: inv.Policy}
}

// record writes rec, the record of inv: a run's call's with the next
// write, a direct call's now, synced unless readOnly (see AuditTrail).
func (a *AuditTrail) record(ctx context.Context, inv keel.ToolInvocation, rec keel.ToolAudit, readOnly bool) {
	var err error
	if inv.Run != "" {
		err = a.s.queueToolCall(rec)
	} else {
		_, err = a.s.recordToolCall(context.WithoutCancel(ctx), rec, readOnly)
	}
	if err != nil {
		a.log.Error("record tool audit", logkey.Tool, inv.Name, logkey.Run, inv.Run, logkey.Err, err)
	}
}

// auditInsert returns the statement that inserts a.
func auditInsert(a keel.ToolAudit) (func(context.Context, *wtx) (sql.Result, error), error) {
	grants, labels, hosts := jsonList(a.Grants), jsonList(a.Labels), jsonList(a.Hosts)
	var pol, refused []byte
	if a.Policy != nil {
		pol, _ = json.Marshal(a.Policy)
	}
	if len(a.Refused) > 0 {
		refused, _ = json.Marshal(a.Refused)
	}
	return func(ctx context.Context, tx *wtx) (sql.Result, error) {
		return tx.ExecContext(ctx, qInsertAudit,
			nanos(a.Time), a.Tool, a.Version, a.SHA256, string(a.RunID), a.Step, a.CallID, a.ArgsSHA256, grants, a.Outcome, a.Error, int64(a.Duration),
			string(pol), labels, hosts, string(refused), a.Client)
	}, nil
}

// jsonList is l as a JSON array; [] for none.
func jsonList(l []string) string {
	if len(l) == 0 {
		return "[]"
	}
	b, _ := json.Marshal(l)
	return string(b)
}

// ToolCalls returns up to limit audit records, newest first; tool, when
// not empty, keeps only that tool's calls.
func (s *Store) ToolCalls(ctx context.Context, tool string, limit int) ([]keel.ToolAudit, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT id, time, tool, version, sha256, run_id, step, call_id, args_sha256, grants, outcome, error, duration,
		policy, labels, hosts, refused, client FROM tool_audit WHERE (? = '' OR tool = ?) ORDER BY id DESC LIMIT ?`, tool, tool, limit)
	if err != nil {
		return nil, fmt.Errorf("tool audit: %w", mapErr(err))
	}
	defer rows.Close()
	var out []keel.ToolAudit
	for rows.Next() {
		var a keel.ToolAudit
		var at, dur int64
		var run, grants, pol, labels, hosts, refused string
		if err := rows.Scan(&a.ID, &at, &a.Tool, &a.Version, &a.SHA256, &run, &a.Step, &a.CallID, &a.ArgsSHA256, &grants, &a.Outcome, &a.Error, &dur,
			&pol, &labels, &hosts, &refused, &a.Client); err != nil {
			return nil, fmt.Errorf("tool audit: %w", mapErr(err))
		}
		a.Time, a.Duration, a.RunID = fromNanos(at), time.Duration(dur), keel.RunID(run)
		for _, f := range []struct {
			name, text string
			dst        any
		}{{"grants", grants, &a.Grants}, {"policy", pol, &a.Policy}, {"labels", labels, &a.Labels}, {"hosts", hosts, &a.Hosts}, {"refused", refused, &a.Refused}} {
			if f.text == "" || f.text == "[]" {
				continue // none: nil
			}
			if err := json.Unmarshal([]byte(f.text), f.dst); err != nil {
				return nil, fmt.Errorf("tool audit %d: %s: %w", a.ID, f.name, err)
			}
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tool audit: %w", mapErr(err))
	}
	return out, nil
}
