// Package query implements MongoDB's query language for the embedded server:
// filter matching (Compile, Matcher), find projections (CompileProjection,
// Projection) and sort orders (CompileSort, Sort).
//
// # Matching
//
// Compile turns a filter document into a tree of small matchers once; Match
// then runs without parsing. Paths follow MongoDB's rules: dotted paths step
// through subdocuments, fan out over arrays of subdocuments, and treat a
// numeric component as an array index; a predicate on a path whose value is
// an array also applies to each element (one level). Comparison operators use
// type bracketing ($gt: 5 matches numbers only) and bsonkit's value order, so
// int32, int64, double and decimal128 compare by value.
//
// # Errors
//
// Invalid or unsupported input returns an *mongoerr.Error carrying MongoDB's error
// code, so the server can answer with the code a real server would send.
// Operators this server does not implement ($where, geo operators,
// $jsonSchema, and $expr unless an evaluator is installed with
// SetExprCompiler) fail with code 238 NotImplemented naming the operator;
// $text fails as mongod does on a collection without a text index (27
// IndexNotFound), since the server has no text indexes.
//
// The package is pure: no locks, no I/O.
package query
