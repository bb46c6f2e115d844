package client

import (
	"context"
	"encoding/json"

	"github.com/keel-runtime/keel"
	"github.com/keel-runtime/keel/ipc/protocol"
)

// Method is a protocol method's name typed with its params P and its
// result R, so that Do checks at compile time what a call sends and
// gets back.
type Method[P, R any] string

// None is the params of a method that takes none (no params member is
// sent) and the result of a method whose result carries nothing (it is
// not decoded).
type None struct{}

// The methods of the protocol (docs/protocol.md), typed for Do.
const (
	Initialize     Method[protocol.InitializeParams, protocol.InitializeResult]       = protocol.MethodInitialize
	ConsoleLogin   Method[None, protocol.ConsoleLoginResult]                          = protocol.MethodConsoleLogin
	TokenCreate    Method[protocol.TokenCreateParams, protocol.TokenCreateResult]     = protocol.MethodTokenCreate
	TokenList      Method[None, protocol.TokenListResult]                             = protocol.MethodTokenList
	TokenRevoke    Method[protocol.TokenRevokeParams, protocol.TokenRevokeResult]     = protocol.MethodTokenRevoke
	RunStart       Method[protocol.RunStartParams, keel.Run]                          = protocol.MethodRunStart
	RunCancel      Method[protocol.RunRef, keel.Run]                                  = protocol.MethodRunCancel
	RunList        Method[protocol.RunListParams, protocol.RunListResult]             = protocol.MethodRunList
	RunGet         Method[protocol.RunRef, protocol.RunDetail]                        = protocol.MethodRunGet
	RunSubscribe   Method[protocol.SubscribeParams, protocol.SubscribeResult]         = protocol.MethodRunSubscribe
	RunUnsubscribe Method[protocol.RunRef, None]                                      = protocol.MethodRunUnsubscribe
	RunPause       Method[protocol.RunRef, keel.Run]                                  = protocol.MethodRunPause
	RunResume      Method[protocol.RunRef, keel.Run]                                  = protocol.MethodRunResume
	RunReplay      Method[protocol.RunRef, protocol.RunReplayResult]                  = protocol.MethodRunReplay
	RunDecide      Method[protocol.RunDecideParams, keel.Run]                         = protocol.MethodRunDecide
	RunApprove     Method[protocol.RunApproveParams, keel.Run]                        = protocol.MethodRunApprove
	RunSay         Method[protocol.RunSayParams, keel.Run]                            = protocol.MethodRunSay
	RunTakeOver    Method[protocol.RunControlParams, keel.Run]                        = protocol.MethodRunTakeOver
	RunHandBack    Method[protocol.RunControlParams, keel.Run]                        = protocol.MethodRunHandBack
	RunTool        Method[protocol.RunToolParams, protocol.RunToolResult]             = protocol.MethodRunTool
	RunFork        Method[protocol.RunForkParams, keel.Run]                           = protocol.MethodRunFork
	RunDeclassify  Method[protocol.RunDeclassifyParams, protocol.RunDeclassifyResult] = protocol.MethodRunDeclassify
	ToolsList      Method[None, protocol.ToolsListResult]                             = protocol.MethodToolsList
	ToolsCall      Method[protocol.ToolsCallParams, protocol.ToolsCallResult]         = protocol.MethodToolsCall
	ToolsAudit     Method[protocol.ToolsAuditParams, protocol.ToolsAuditResult]       = protocol.MethodToolsAudit
	ToolsInspect   Method[protocol.ToolsInspectParams, protocol.ToolInfo]             = protocol.MethodToolsInspect
	ToolsInstall   Method[protocol.ToolsInstallParams, protocol.ToolInfo]             = protocol.MethodToolsInstall
	ToolsRemove    Method[protocol.ToolRef, None]                                     = protocol.MethodToolsRemove
	ToolsGrant     Method[protocol.ToolsGrantParams, protocol.ToolInfo]               = protocol.MethodToolsGrant
	ToolsRevoke    Method[protocol.ToolsRevokeParams, protocol.ToolInfo]              = protocol.MethodToolsRevoke
	EnvDescribe    Method[None, protocol.EnvDescribeResult]                           = protocol.MethodEnvDescribe
	ModelsList     Method[None, protocol.ModelsListResult]                            = protocol.MethodModelsList
	ModelsPull     Method[protocol.ModelsPullParams, protocol.ModelsPullResult]       = protocol.MethodModelsPull
	ModelsChat     Method[protocol.ModelsChatParams, protocol.ModelsChatResult]       = protocol.MethodModelsChat
	PolicyShow     Method[protocol.PolicyShowParams, protocol.PolicyShowResult]       = protocol.MethodPolicyShow
	PolicyExplain  Method[protocol.PolicyExplainParams, protocol.PolicyExplainResult] = protocol.MethodPolicyExplain

	KnowledgeAdd      Method[protocol.KnowledgeAddParams, protocol.KnowledgeAddResult]       = protocol.MethodKnowledgeAdd
	KnowledgeRemember Method[protocol.KnowledgeRememberParams, protocol.KnowledgeDoc]        = protocol.MethodKnowledgeRemember
	KnowledgeSearch   Method[protocol.KnowledgeSearchParams, protocol.KnowledgeSearchResult] = protocol.MethodKnowledgeSearch
	KnowledgeList     Method[protocol.KnowledgeListParams, protocol.KnowledgeListResult]     = protocol.MethodKnowledgeList
	KnowledgeForget   Method[protocol.KnowledgeForgetParams, protocol.KnowledgeForgetResult] = protocol.MethodKnowledgeForget
	KnowledgeWatch    Method[protocol.KnowledgeWatchParams, protocol.KnowledgeWatch]         = protocol.MethodKnowledgeWatch
	KnowledgeUnwatch  Method[protocol.KnowledgeUnwatchParams, None]                          = protocol.MethodKnowledgeUnwatch
	KnowledgeLabels   Method[protocol.KnowledgeLabelsParams, protocol.KnowledgeScope]        = protocol.MethodKnowledgeLabels
)

// Do calls m on c with params p and returns its decoded result. Errors
// are as Call's: an error response is a *protocol.Error; if ctx ends
// first, Do returns ctx's error and the request may still take effect.
func Do[P, R any](ctx context.Context, c *Client, m Method[P, R], p P) (R, error) {
	return DoStream[P, R, json.RawMessage](ctx, c, m, p, nil)
}

// DoStream is Do for a method whose call streams notifications carrying
// its id (models.pull.progress, models.chat.delta): each, decoded as an
// E, is passed to each on the calling goroutine, in order, all before
// DoStream returns. each should return promptly: while the notifications
// it has not taken fill a buffer (64), the client stops reading,
// responses included. A notification that does not decode as an E is
// skipped. each may be nil to ignore them.
func DoStream[P, R, E any](ctx context.Context, c *Client, m Method[P, R], p P, each func(E)) (R, error) {
	var r R
	var params, result any = p, &r
	if _, none := any(p).(None); none {
		params = nil
	}
	if _, none := any(r).(None); none {
		result = nil
	}
	var progress func(json.RawMessage)
	if each != nil {
		progress = func(raw json.RawMessage) {
			var e E
			if json.Unmarshal(raw, &e) == nil {
				each(e)
			}
		}
	}
	err := c.call(ctx, string(m), params, result, progress)
	return r, err
}
