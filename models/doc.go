// Package models owns the model layer: the Provider interface every model
// backend implements, the capability and model descriptors callers select
// by, and the errors callers branch on. Backends live in sub-packages
// (models/ollama); models/scripted is a deterministic fake for tests and
// models/modelstest is the conformance suite every provider passes;
// models/modelsfile builds the layer (providers and router) from a
// models.json. Service serves the model methods of the protocol
// (models.list, models.pull, models.chat) over the root package's request
// types, so the protocol server calls it without a translation layer.
package models
