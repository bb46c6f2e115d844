// Package intercept is the seam around the two calls every layer above
// the runtime wants to see: a tool call and a model call. An interceptor
// sees each call before it runs (the invocation: who calls what) and may
// deny it, and sees it again after it ran or was denied, with the
// decision and the outcome (a result or a classified error, and how long
// it took). The audit trail is one (store.AuditTrail); policy, telemetry
// and labels are the next.
//
// # Order
//
// A chain (Tools, Models) runs its interceptors in order: the Before hook
// of each, first to last, until one denies (the rest are not asked and
// the call does not run); then the call; then the After hook of every
// interceptor in the chain, last to first, whether the call ran or not.
// So the first interceptor sees a call before anyone else and its outcome
// after everyone else: the audit trail goes first, and records the
// decision of any policy after it.
//
// # Where the chains run
//
// The tool chain runs at the registry's call entry
// (wasmtools.Config.Interceptors), the one path every tool call takes,
// from a run or direct; the model chain runs at the engine's model call
// sites (engine.Config.ModelInterceptors) and at a direct models.chat
// (models.ServiceConfig.Interceptors). Hooks run on the caller's
// goroutine, inside the call: a hook that blocks delays the call, and
// After hooks have all returned before the call returns to its caller.
//
// The package imports only the root package and the standard library,
// so anything may implement an interceptor without pulling in the
// runtime.
package intercept
