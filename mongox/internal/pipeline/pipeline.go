package pipeline

import (
	"errors"
	"time"

	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/event-outbox/outbox/mongox/internal/query"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// Pipeline is a compiled aggregation pipeline. It is immutable and safe for
// concurrent use.
type Pipeline struct {
	stages []stage
	names  []string
	env    Env
}

// stage is one compiled pipeline stage.
type stage interface {
	run(in []bson.D, c *ctx) ([]bson.D, error)
}

// stageParser compiles the argument of one stage.
type stageParser func(arg any, vars bson.D) (stage, error)

// stageParsers is the stage table (filled in init to break the
// initialization cycle through $facet).
var stageParsers map[string]stageParser

// unsupportedStages are real MongoDB stages this server does not run.
var unsupportedStages = map[string]bool{
	"$graphLookup": true, "$out": true, "$merge": true, "$geoNear": true,
	"$search": true, "$searchMeta": true, "$vectorSearch": true, "$unionWith": true,
	"$sample": true, "$densify": true, "$fill": true,
	"$documents": true, "$listLocalSessions": true,
	"$planCacheStats": true, "$collStats": true, "$indexStats": true, "$currentOp": true,
	"$listSessions": true, "$listSearchIndexes": true, "$changeStreamSplitLargeEvent": true,
	"$shardedDataDistribution": true, "$listSampledQueries": true, "$querySettings": true,
}

// changeStreamStages are the stages allowed after $changeStream.
var changeStreamStages = map[string]bool{
	"$match": true, "$project": true, "$addFields": true, "$set": true, "$unset": true,
	"$replaceRoot": true, "$replaceWith": true, "$redact": true,
}

func init() {
	stageParsers = map[string]stageParser{
		"$match":           parseMatch,
		"$sort":            parseSort,
		"$skip":            parseSkip,
		"$limit":           parseLimit,
		"$project":         parseProject,
		"$addFields":       func(arg any, vars bson.D) (stage, error) { return parseAddFields("$addFields", arg, vars) },
		"$set":             func(arg any, vars bson.D) (stage, error) { return parseAddFields("$set", arg, vars) },
		"$unset":           parseUnset,
		"$group":           parseGroup,
		"$count":           parseCount,
		"$unwind":          parseUnwind,
		"$replaceRoot":     parseReplaceRoot,
		"$replaceWith":     parseReplaceWith,
		"$sortByCount":     parseSortByCount,
		"$facet":           parseFacet,
		"$redact":          parseRedact,
		"$lookup":          parseLookup,
		"$bucket":          parseBucket,
		"$bucketAuto":      parseBucketAuto,
		"$setWindowFields": parseSetWindowFields,
	}
	query.SetExprCompiler(compileExprPredicate)
}

// compileExprPredicate backs the query matcher's $expr: the expression is
// compiled once; an evaluation error makes the document not match.
func compileExprPredicate(expr any, vars bson.D) (func(doc bson.D) bool, error) {
	e, err := CompileExprWithVars(expr, vars)
	if err != nil {
		return nil, err
	}
	return func(doc bson.D) bool {
		env := Env{Now: time.Now()}
		v, err := e.fn(newCtx(doc, &env))
		return err == nil && truthy(v)
	}, nil
}

// Compile parses an aggregation pipeline: an array of single-field stage
// documents. Unknown stages fail with code 40324, stages this server does
// not implement with code 238 NotImplemented naming them.
func Compile(stages bson.A, env Env) (*Pipeline, error) {
	p := &Pipeline{env: env}
	for i, s := range stages {
		d, ok := normalize(s).(bson.D)
		if !ok {
			return nil, errf(codeTypeMismatch, "Each element of the 'pipeline' array must be an object")
		}
		if len(d) != 1 {
			return nil, errf(40323, "A pipeline stage specification object must contain exactly one field.")
		}
		name, arg := d[0].Key, d[0].Value
		if name == "$changeStream" {
			if i == 0 {
				return nil, errf(codeNotImplemented, "$changeStream is handled by the server, not by the pipeline package")
			}
			return nil, errf(40602, "$changeStream is only valid as the first stage in a pipeline.")
		}
		parse, ok := stageParsers[name]
		if !ok {
			if unsupportedStages[name] {
				return nil, errf(codeNotImplemented, "%s is not supported by the embedded MongoDB server", name)
			}
			return nil, errf(40324, "Unrecognized pipeline stage name: '%s'", name)
		}
		st, err := parse(arg, env.Vars)
		if err != nil {
			return nil, err
		}
		if l, ok := st.(*limitStage); ok && len(p.stages) > 0 {
			if srt, ok := p.stages[len(p.stages)-1].(*sortStage); ok && srt.limit == 0 {
				srt.limit = l.n
			}
		}
		p.stages = append(p.stages, st)
		p.names = append(p.names, name)
	}
	return p, nil
}

// KnownStage reports whether MongoDB has an aggregation stage of that name
// (whether or not this server runs it).
func KnownStage(name string) bool {
	_, ok := stageParsers[name]
	return ok || unsupportedStages[name] || name == "$changeStream"
}

// Stages returns the stage names in order.
func (p *Pipeline) Stages() []string { return append([]string(nil), p.names...) }

// ChangeStreamSafe returns nil when every stage may follow $changeStream
// ($match, $project, $addFields, $set, $unset, $replaceRoot, $replaceWith,
// $redact), else an error naming the first stage that may not.
func (p *Pipeline) ChangeStreamSafe() error {
	for _, n := range p.names {
		if !changeStreamStages[n] {
			return errf(codeIllegalOperation, "%s is not permitted in a $changeStream pipeline", n)
		}
	}
	return nil
}

// Run applies the pipeline to in and returns the resulting documents. It
// never modifies in; results may share sub-values with it.
func (p *Pipeline) Run(in []bson.D) ([]bson.D, error) {
	c := newCtx(nil, &p.env)
	docs := in
	for _, st := range p.stages {
		out, err := st.run(docs, c)
		if err != nil {
			return nil, err
		}
		docs = out
	}
	// Never hand out (a part of) the caller's own slice.
	out := make([]bson.D, len(docs))
	copy(out, docs)
	return out, nil
}

// asPipelineError unwraps a query package error to its *mongoerr.Error.
func asPipelineError(err error) error {
	var qe *mongoerr.Error
	if errors.As(err, &qe) {
		return &mongoerr.Error{Code: qe.Code, CodeName: qe.CodeName, Msg: qe.Msg}
	}
	return err
}
