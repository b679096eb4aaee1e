// Package pipeline compiles and runs MongoDB aggregation pipelines and
// evaluates aggregation expressions, for the embedded server.
//
// # Stages
//
// Compile parses a pipeline once (expressions included) and Run applies it
// to a batch of documents. Supported stages: $match, $sort, $skip, $limit,
// $project, $addFields, $set, $unset, $group, $count, $unwind,
// $replaceRoot, $replaceWith, $sortByCount, $facet, $redact, $lookup (with
// the Env's Lookup), $bucket, $bucketAuto and $setWindowFields. Stages
// that need the server ($out, $merge, $collStats, $currentOp, ...) are
// run by it; the others fail to compile with an error naming them.
//
// # Expressions
//
// Eval evaluates one expression against a document ($expr in queries uses
// it). Field paths follow MongoDB's rules: "$a.b" over an array of
// documents yields the array of their b values. Values are the driver's
// bson types; a missing value is distinct from null inside the package and
// surfaces as nil (null) from Eval.
//
// # Errors
//
// Parse and evaluation errors are *mongoerr.Error values carrying MongoDB's numeric
// code and code name, so the server can return them to clients unchanged.
//
// The package is pure: no locks, no I/O. Run never modifies its input;
// output documents may share unchanged sub-values with input documents,
// so callers treat both as read-only.
package pipeline
