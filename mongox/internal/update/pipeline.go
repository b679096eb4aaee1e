package update

import (
	"errors"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/event-outbox/outbox/mongox/internal/pipeline"
)

// CodeInvalidOptions is returned for a stage not allowed in an update
// pipeline.
const CodeInvalidOptions = 72

// pipelineStages are the stages MongoDB allows in an update pipeline.
var pipelineStages = map[string]bool{
	"$addFields": true, "$set": true, "$project": true, "$unset": true,
	"$replaceRoot": true, "$replaceWith": true,
}

func parsePipeline(stages bson.A, vars bson.D) (*Update, error) {
	for _, s := range stages {
		d, ok := s.(bson.D)
		if !ok || len(d) != 1 {
			return nil, newErr(CodeFailedToParse, "Each element of the 'pipeline' array must be an object with exactly one field")
		}
		if !pipelineStages[d[0].Key] {
			return nil, newErr(CodeInvalidOptions, "%s is not allowed to be used within an update", d[0].Key)
		}
	}
	if _, err := pipeline.Compile(stages, pipeline.Env{Vars: vars}); err != nil {
		return nil, fromPipelineErr(err)
	}
	return &Update{stages: stages, vars: vars}, nil
}

// fromPipelineErr keeps the code of a pipeline error when it has one.
func fromPipelineErr(err error) error {
	var pe *mongoerr.Error
	if errors.As(err, &pe) {
		return &mongoerr.Error{Code: pe.Code, CodeName: pe.CodeName, Msg: pe.Msg}
	}
	return newErr(CodeBadValue, "%s", err.Error())
}

func (u *Update) applyPipeline(doc bson.D, opts ApplyOptions) (bson.D, error) {
	p, err := pipeline.Compile(u.stages, pipeline.Env{Now: opts.Now, Vars: u.vars})
	if err != nil {
		return nil, fromPipelineErr(err)
	}
	in := bsonkit.CopyDoc(doc)
	if in == nil {
		in = bson.D{}
	}
	out, err := p.Run([]bson.D{in})
	if err != nil {
		return nil, fromPipelineErr(err)
	}
	if len(out) != 1 {
		return nil, newErr(CodeBadValue, "an update pipeline must produce exactly one document, got %d", len(out))
	}
	res := bsonkit.CopyDoc(out[0])
	newID, hasNew := bsonkit.Get(res, "_id")
	oldID, hasOld := bsonkit.Get(doc, "_id")
	if hasOld {
		if hasNew && (!bsonkit.Equal(oldID, newID) || bsonkit.Rank(oldID) != bsonkit.Rank(newID)) {
			return nil, newErr(CodeImmutableField, "Performing an update on the path '_id' would modify the immutable field '_id'")
		}
		if !hasNew {
			res = append(bson.D{{Key: "_id", Value: bsonkit.Copy(oldID)}}, res...)
		}
	}
	if id, ok := bsonkit.Get(res, "_id"); ok {
		if _, isArr := id.(bson.A); isArr {
			return nil, newErr(CodeInvalidIDField, "The '_id' value cannot be of type array")
		}
	}
	return idFirst(res), nil
}
