// Package update implements MongoDB's update language for the embedded
// server: replacement documents and the update operators ($set, $unset,
// $inc, $mul, $min, $max, $rename, $setOnInsert, $currentDate, $push,
// $addToSet, $pull, $pullAll, $pop), pipeline-style updates (through the
// pipeline package), the seed document of an upsert, and the field-level
// diff a change stream reports.
//
// # Parsing and applying
//
// Parse validates an update once; Apply then produces the new version of a
// document without mutating its input, so one parsed update serves every
// document of an updateMany. Dotted paths step into subdocuments and, with
// a numeric component, into array elements; missing intermediate documents
// are created and arrays are padded with nulls. The all-elements operator
// $[] and filtered $[<identifier>] (with ApplyOptions.ArrayFilters) are
// supported, and so is the positional operator $ (ApplyOptions.Query says which
// array element the query matched).
//
// Operators process paths in MongoDB 5.0+ order (field names in
// lexicographic order, numeric components numerically), so new fields land
// at the end of their document in that order, while existing fields keep
// their position.
//
// # Errors
//
// Every error is an *mongoerr.Error carrying MongoDB's error code and code name, with
// MongoDB's wording where clients are known to look at it.
//
// The package is pure: no locks, no I/O.
package update
