// Package gateway serves keel/1 over WebSocket in front of a cloud fleet:
// clients speak the protocol the daemon speaks (ipc's own server, one per
// tenant), and each tenant's token reaches only that tenant's NATS
// account. run.start queues a run (cloud.Submit) and answers once a
// worker has created it; run.list, run.get and run.subscribe read the
// tenant's journal (cloud/jsstore); run.cancel, pause, say, decide,
// approve and resume reach the run's worker through cloud.Client;
// tools.list and models.list show the workers' (within the tenant's
// limits). Every other method is not served (method not found).
// docs/cloud.md has the design.
//
// Gateway.Run starts and stops every goroutine the gateway uses; the
// tenants' NATS connections are the caller's.
package gateway
