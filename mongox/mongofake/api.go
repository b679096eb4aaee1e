package mongofake

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// The Stable API (https://www.mongodb.com/docs/v7.0/reference/stable-api/):
// a command may carry apiVersion, apiStrict and apiDeprecationErrors. mongod
// checks them once the command is known and before it runs
// (validateAPIParameters): apiStrict or apiDeprecationErrors without
// apiVersion fail with 4886600, a version other than "1" with 322
// APIVersionError, a command outside the declared version with 323
// APIStrictError under apiStrict, and a deprecated one with 324
// APIDeprecationError under apiDeprecationErrors.

// apiV1Commands are the commands of Stable API version 1 that this server
// knows (the manual's list of V1 commands; collStats and explain are in it
// as mongod registers them).
var apiV1Commands = map[string]bool{
	"abortTransaction": true, "aggregate": true, "authenticate": true, "collMod": true,
	"collStats": true, "commitTransaction": true, "count": true, "create": true,
	"createIndexes": true, "createSearchIndexes": true, "delete": true, "drop": true,
	"dropDatabase": true, "dropIndexes": true, "dropSearchIndex": true, "endSessions": true,
	"explain": true, "find": true, "findAndModify": true, "findandmodify": true,
	"getMore": true, "hello": true, "insert": true, "killCursors": true,
	"listCollections": true, "listDatabases": true, "listIndexes": true, "ping": true,
	"refreshSessions": true, "renameCollection": true, "saslContinue": true,
	"saslStart": true, "update": true, "updateSearchIndex": true,
	"createUser": true, "updateUser": true, "dropUser": true,
	"createRole": true, "updateRole": true, "dropRole": true,
	"grantRolesToUser": true, "revokeRolesFromUser": true,
	"grantRolesToRole": true, "revokeRolesFromRole": true,
	"grantPrivilegesToRole": true, "revokePrivilegesFromRole": true,
}

// apiV1Stages are the aggregation stages of Stable API version 1; under
// apiStrict, a pipeline with another stage fails with APIStrictError.
var apiV1Stages = map[string]bool{
	"$addFields": true, "$bucket": true, "$bucketAuto": true, "$changeStream": true,
	"$collStats": true, "$count": true, "$densify": true, "$documents": true,
	"$facet": true, "$fill": true, "$geoNear": true, "$graphLookup": true,
	"$group": true, "$indexStats": true, "$limit": true, "$lookup": true,
	"$match": true, "$merge": true, "$out": true, "$project": true, "$redact": true,
	"$replaceRoot": true, "$replaceWith": true, "$sample": true, "$set": true,
	"$setWindowFields": true, "$skip": true, "$sort": true, "$sortByCount": true,
	"$unionWith": true, "$unset": true, "$unwind": true,
}

// apiParams are a command's Stable API fields.
type apiParams struct {
	version           string // "" when not given
	strict            bool
	deprecationErrors bool
	// set reports which of the three fields were present.
	hasVersion, hasStrict, hasDeprecation bool
}

// parseAPIParams reads apiVersion, apiStrict and apiDeprecationErrors.
func parseAPIParams(cmd bson.D) (apiParams, error) {
	var p apiParams
	for _, e := range cmd {
		switch e.Key {
		case "apiVersion":
			s, ok := e.Value.(string)
			if !ok {
				return p, wrongType("apiVersion", e.Value, "string")
			}
			p.version, p.hasVersion = s, true
		case "apiStrict":
			b, ok := e.Value.(bool)
			if !ok {
				return p, wrongType("apiStrict", e.Value, "bool")
			}
			p.strict, p.hasStrict = b, true
		case "apiDeprecationErrors":
			b, ok := e.Value.(bool)
			if !ok {
				return p, wrongType("apiDeprecationErrors", e.Value, "bool")
			}
			p.deprecationErrors, p.hasDeprecation = b, true
		}
	}
	return p, nil
}

// apiVersionsOf returns the API versions a command belongs to and those it
// is deprecated in.
func apiVersionsOf(name string, spec *commandSpec) (versions, deprecated []string) {
	if spec.apiVersions != nil {
		return spec.apiVersions, spec.deprecatedIn
	}
	if apiV1Commands[name] {
		return []string{"1"}, nil
	}
	return nil, nil
}

// checkAPIParams refuses a command whose Stable API fields mongod refuses.
func checkAPIParams(name string, spec *commandSpec, p apiParams) error {
	if (p.hasStrict || p.hasDeprecation) && !p.hasVersion {
		return errorf(4886600, "Location4886600", "Provided apiStrict and/or apiDeprecationErrors without passing apiVersion")
	}
	if !p.hasVersion {
		return nil
	}
	switch p.version {
	case "1":
	case "2":
		return errorf(322, "APIVersionError", "Cannot accept API version 2")
	default:
		return errorf(322, "APIVersionError", `API version must be "1"`)
	}
	versions, deprecated := apiVersionsOf(name, spec)
	if p.strict && !contains(versions, p.version) {
		return errorf(323, "APIStrictError", fmt.Sprintf(
			"Provided apiStrict:true, but the command %s is not in API Version %s. Information on supported commands and migrations in API Version %s can be found at https://dochub.mongodb.org/core/manual-versioned-api.",
			spec.names[0], p.version, p.version))
	}
	if p.deprecationErrors && contains(deprecated, p.version) {
		return errorf(324, "APIDeprecationError", fmt.Sprintf(
			"Provided apiDeprecationErrors:true, but the command %s is deprecated in API Version %s.", spec.names[0], p.version))
	}
	return nil
}

// checkStrictStages refuses, under apiStrict, an aggregation stage outside
// API version 1, as mongod does when it parses the pipeline.
func checkStrictStages(r *request, stages bson.A) error {
	if !r.api.strict || r.api.version != "1" {
		return nil
	}
	for _, st := range stages {
		name := stageName(st)
		if name != "" && !apiV1Stages[name] {
			return errorf(323, "APIStrictError", name+" is not allowed with 'apiStrict: true' in API Version 1")
		}
	}
	return nil
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// The test commands mongod registers with enableTestCommands to exercise
// API versioning (testVersion2 is in version 2 only, testDeprecation is
// deprecated in version 1, ...). They answer {ok: 1} once the API checks
// let them run.
func init() {
	register(
		commandSpec{names: []string{"testVersion2"}, handler: ping, noSession: true, testOnly: true,
			apiVersions: []string{"2"}},
		commandSpec{names: []string{"testVersions1And2"}, handler: ping, noSession: true, testOnly: true,
			apiVersions: []string{"1", "2"}},
		commandSpec{names: []string{"testDeprecation"}, handler: ping, noSession: true, testOnly: true,
			apiVersions: []string{"1"}, deprecatedIn: []string{"1"}},
		commandSpec{names: []string{"testDeprecationInVersion2"}, handler: ping, noSession: true, testOnly: true,
			apiVersions: []string{"1", "2"}, deprecatedIn: []string{"2"}},
		commandSpec{names: []string{"testRemoval"}, handler: ping, noSession: true, testOnly: true,
			apiVersions: []string{"1"}},
	)
}
