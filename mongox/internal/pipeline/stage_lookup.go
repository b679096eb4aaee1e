package pipeline

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/query"
)

// --- $lookup ---

// lookupStage joins each input document with the documents of another
// collection of the same database, read through Env.Lookup: by equality of
// localField and foreignField, through a pipeline with let variables, or
// both (MongoDB 5.0+).
type lookupStage struct {
	from         string
	localField   []string // nil when not given
	foreignField string
	as           string
	let          bson.D    // expressions, evaluated per input document
	pipe         bson.A    // nil when not given
	vars         bson.D    // the enclosing command's variables
	fixed        *Pipeline // the pipeline compiled once when it uses no let
}

func parseLookup(arg any, vars bson.D) (stage, error) {
	d, ok := arg.(bson.D)
	if !ok {
		return nil, errf(40319, "the $lookup specification must be an Object")
	}
	s := &lookupStage{vars: vars}
	var hasLocal, hasForeign, hasPipe, hasLet bool
	for _, e := range d {
		switch e.Key {
		case "from":
			str, ok := e.Value.(string)
			if !ok {
				if _, isDoc := e.Value.(bson.D); isDoc {
					return nil, errf(codeNotImplemented, "$lookup from another database ({db, coll}) is not supported by the embedded MongoDB server")
				}
				return nil, errf(40321, "$lookup 'from' must be a string, found %s", typeName(e.Value))
			}
			s.from = str
		case "localField", "foreignField", "as":
			str, ok := e.Value.(string)
			if !ok {
				return nil, errf(40321, "$lookup argument '%s' must be a string, found %s", e.Key, typeName(e.Value))
			}
			if str == "" || strings.HasPrefix(str, "$") {
				return nil, errf(16410, "FieldPath field names may not start with '$' or be empty: %q", str)
			}
			switch e.Key {
			case "localField":
				s.localField, hasLocal = strings.Split(str, "."), true
			case "foreignField":
				s.foreignField, hasForeign = str, true
			case "as":
				s.as = str
			}
		case "let":
			l, ok := e.Value.(bson.D)
			if !ok {
				return nil, errf(codeFailedToParse, "$lookup argument 'let' must be an object, is type %s", typeName(e.Value))
			}
			s.let, hasLet = l, true
		case "pipeline":
			p, ok := e.Value.(bson.A)
			if !ok {
				return nil, errf(codeFailedToParse, "$lookup argument 'pipeline' must be an array, is type %s", typeName(e.Value))
			}
			for _, st := range p {
				if sd, ok := st.(bson.D); ok && len(sd) == 1 && (sd[0].Key == "$out" || sd[0].Key == "$merge") {
					return nil, errf(51047, "%s is not allowed within a $lookup's sub-pipeline", sd[0].Key)
				}
			}
			s.pipe, hasPipe = p, true
		default:
			return nil, errf(codeFailedToParse, "unknown argument to $lookup: %s", e.Key)
		}
	}
	if s.as == "" {
		return nil, errf(codeFailedToParse, "must specify 'as' field for a $lookup")
	}
	if hasLocal != hasForeign {
		return nil, errf(codeFailedToParse, "$lookup requires both or neither of 'localField' and 'foreignField' to be specified")
	}
	if !hasLocal && !hasPipe {
		return nil, errf(codeFailedToParse, "$lookup requires either 'pipeline' or both 'localField' and 'foreignField' to be specified")
	}
	if hasLet && !hasPipe {
		return nil, errf(codeFailedToParse, "$lookup with 'let' must also specify 'pipeline'")
	}
	if s.from == "" {
		return nil, errf(codeFailedToParse, "missing 'from' option to $lookup stage specification")
	}
	for _, e := range s.let {
		if e.Key == "" || !(e.Key[0] >= 'a' && e.Key[0] <= 'z') && e.Key[0] < 0x80 {
			return nil, errf(16870, "'%s' starts with an invalid character for a user variable name", e.Key)
		}
	}
	// Compile now to report errors early (let names are in scope as null).
	probe := append(append(bson.D{}, vars...), nullVars(s.let)...)
	if hasPipe {
		p, err := Compile(s.pipe, Env{Vars: probe})
		if err != nil {
			return nil, err
		}
		if len(s.let) == 0 {
			s.fixed = p
		}
	}
	return s, nil
}

func nullVars(let bson.D) bson.D {
	out := make(bson.D, len(let))
	for i, e := range let {
		out[i] = bson.E{Key: e.Key}
	}
	return out
}

func (s *lookupStage) run(in []bson.D, c *ctx) ([]bson.D, error) {
	if c.lookup == nil {
		return nil, errf(codeNotImplemented, "$lookup needs the server's collections (no Env.Lookup was given)")
	}
	foreign, err := c.lookup(s.from)
	if err != nil {
		return nil, err
	}
	env := Env{Now: c.now.Time(), ClusterTime: c.cluster, Lookup: c.lookup}
	var fixedOut []bson.D
	fixedDone := false
	out := make([]bson.D, 0, len(in))
	for _, d := range in {
		candidates := foreign
		if s.localField != nil {
			m, err := s.equalityMatcher(d)
			if err != nil {
				return nil, err
			}
			candidates = make([]bson.D, 0)
			for _, f := range foreign {
				if m.Match(f) {
					candidates = append(candidates, f)
				}
			}
		}
		joined := candidates
		if s.pipe != nil {
			switch {
			case s.fixed != nil && s.localField == nil:
				if !fixedDone {
					env.Vars = s.vars
					p := *s.fixed
					p.env = env
					if fixedOut, err = p.Run(candidates); err != nil {
						return nil, err
					}
					fixedDone = true
				}
				joined = fixedOut
			default:
				vars := append(bson.D{}, s.vars...)
				for _, e := range s.let {
					v, err := Eval(e.Value, d, Env{Now: env.Now, ClusterTime: env.ClusterTime, Vars: s.vars})
					if err != nil {
						return nil, err
					}
					vars = append(vars, bson.E{Key: e.Key, Value: v})
				}
				env.Vars = vars
				p, err := Compile(s.pipe, env)
				if err != nil {
					return nil, err
				}
				if joined, err = p.Run(candidates); err != nil {
					return nil, err
				}
			}
		}
		arr := make(bson.A, len(joined))
		for i, j := range joined {
			arr[i] = j
		}
		out = append(out, bsonkit.Set(bsonkit.CopyDoc(d), s.as, arr))
	}
	return out, nil
}

// equalityMatcher matches the foreign documents whose foreignField equals
// the input's localField, or one of its elements when it is an array; a
// missing localField matches null and missing, as on MongoDB.
func (s *lookupStage) equalityMatcher(d bson.D) (*query.Matcher, error) {
	v := walkPath(d, s.localField)
	var values bson.A
	switch x := v.(type) {
	case bson.A:
		values = append(values, x...)
	default:
		if isMissing(v) {
			v = nil
		}
		values = bson.A{v}
	}
	for i, x := range values {
		if re, ok := x.(bson.Regex); ok {
			// A regex from the document is a value to compare, not a pattern.
			values[i] = bson.D{{Key: "$eq", Value: re}}
		}
	}
	var or bson.A
	plain := bson.A{}
	for _, x := range values {
		if eq, ok := x.(bson.D); ok && len(eq) == 1 && eq[0].Key == "$eq" {
			or = append(or, bson.D{{Key: s.foreignField, Value: eq}})
			continue
		}
		plain = append(plain, x)
	}
	or = append(or, bson.D{{Key: s.foreignField, Value: bson.D{{Key: "$in", Value: plain}}}})
	m, err := query.Compile(bson.D{{Key: "$or", Value: or}})
	if err != nil {
		return nil, asPipelineError(err)
	}
	return m, nil
}
