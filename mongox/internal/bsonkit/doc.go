// Package bsonkit holds the value-level rules of MongoDB's data model that
// every other part of the embedded server shares: the canonical type order,
// comparison and equality of BSON values (numbers compare by value across
// int32, int64, double and decimal128), a hashable key encoding that agrees
// with equality, deep copies and dotted-path access.
//
// Documents are bson.D, arrays bson.A, as the driver's bson package decodes
// them. Decoder and AppendDocument convert between those and BSON bytes
// without reflection, with the driver's results (the server's commands and
// replies go through them). The package is pure: no locks, no I/O.
package bsonkit
