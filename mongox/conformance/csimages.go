package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// changeStreamImageCases cover pre- and post-images (MongoDB 6.0+): the
// collection option changeStreamPreAndPostImages and the change stream
// options fullDocument whenAvailable/required and fullDocumentBeforeChange;
// and showExpandedEvents (DDL events, collectionUUID,
// operationDescription).
func changeStreamImageCases(t *testing.T, env EnvFunc) {
	runCases(t, env, []tcase{
		{"ImagesWhenEnabled", testImagesEnabled},
		{"ImagesWhenDisabled", testImagesDisabled},
		{"ExpandedEvents", testExpandedEvents},
		{"ProjectingOutIDIsFatal", testProjectOutID},
		{"TruncatedArraysAndDisambiguatedPaths", testTruncatedAndDisambiguated},
	})
}

func testImagesEnabled(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	require.NoError(t, db.CreateCollection(ctx, "c", options.CreateCollection().SetChangeStreamPreAndPostImages(D(`{"enabled":true}`))))
	coll := db.Collection("c")
	specs, err := db.ListCollectionSpecifications(ctx, D(`{"name":"c"}`))
	require.NoError(t, err)
	require.Len(t, specs, 1)
	requireDoc(t, `{"changeStreamPreAndPostImages":{"enabled":true}}`, rawDoc(t, specs[0].Options), "listCollections shows the option")
	insert(t, ctx, coll, `[{"_id":1,"x":1}]`)
	cs := watch(t, ctx, coll, nil, options.ChangeStream().SetFullDocument(options.Required).SetFullDocumentBeforeChange(options.Required))
	_, err = coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$set":{"x":2}}`))
	require.NoError(t, err)
	_, err = coll.ReplaceOne(ctx, D(`{"_id":1}`), D(`{"y":1}`))
	require.NoError(t, err)
	_, err = coll.DeleteOne(ctx, D(`{"_id":1}`))
	require.NoError(t, err)
	evs := nextEvents(t, cs, 3)
	requireField(t, evs[0], "fullDocument", `{"_id":1,"x":2}`)
	requireField(t, evs[0], "fullDocumentBeforeChange", `{"_id":1,"x":1}`)
	requireField(t, evs[1], "fullDocument", `{"_id":1,"y":1}`)
	requireField(t, evs[1], "fullDocumentBeforeChange", `{"_id":1,"x":2}`)
	requireField(t, evs[2], "fullDocumentBeforeChange", `{"_id":1,"y":1}`)
}

func testImagesDisabled(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	insert(t, ctx, coll, `[{"_id":1,"x":1},{"_id":2,"x":1}]`)
	avail := watch(t, ctx, coll, nil, options.ChangeStream().SetFullDocument(options.WhenAvailable).SetFullDocumentBeforeChange(options.WhenAvailable))
	_, err := coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$set":{"x":2}}`))
	require.NoError(t, err)
	ev := nextEvent(t, avail)
	require.True(t, hasField(ev, "fullDocument"), "whenAvailable reports fullDocument: %s", js(ev))
	require.Nil(t, get(ev, "fullDocument"), "whenAvailable without images gives null: %s", js(ev))
	require.Nil(t, get(ev, "fullDocumentBeforeChange"), "whenAvailable without images gives null: %s", js(ev))

	req := watch(t, ctx, coll, nil, options.ChangeStream().SetFullDocumentBeforeChange(options.Required))
	_, err = coll.UpdateOne(ctx, D(`{"_id":2}`), D(`{"$set":{"x":2}}`))
	require.NoError(t, err)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.False(t, req.Next(cctx), "required without images fails the stream")
	requireCode(t, req.Err(), 47, "NoMatchingDocument")
}

func hasField(d bson.D, key string) bool {
	for _, e := range d {
		if e.Key == key {
			return true
		}
	}
	return false
}

func testExpandedEvents(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	plain := watch(t, ctx, db, nil)
	cs := watch(t, ctx, db, nil, options.ChangeStream().SetShowExpandedEvents(true))
	require.NoError(t, db.CreateCollection(ctx, "c"))
	coll := db.Collection("c")
	insert(t, ctx, coll, `[{"_id":1}]`)
	_, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D(`{"x":1}`)})
	require.NoError(t, err)
	require.NoError(t, db.RunCommand(ctx, D(`{"collMod":"c"}`)).Err())
	require.NoError(t, coll.Indexes().DropOne(ctx, "x_1"))
	require.NoError(t, coll.Drop(ctx))

	evs := nextEvents(t, cs, 6)
	require.Equal(t, []string{"create", "insert", "createIndexes", "modify", "dropIndexes", "drop"}, opTypes(evs))
	for _, ev := range evs {
		require.NotNil(t, get(ev, "collectionUUID"), "expanded events carry collectionUUID: %s", js(ev))
	}
	require.NotNil(t, get(evs[2], "operationDescription"), "createIndexes describes the index: %s", js(evs[2]))
	require.Equal(t, []string{"insert", "drop"}, opTypes(nextEvents(t, plain, 2)), "without showExpandedEvents DDL events other than drop are hidden")
}

func testProjectOutID(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	cs := watch(t, ctx, coll, Ds(`[{"$project":{"_id":0}}]`))
	insert(t, ctx, coll, `[{"_id":1}]`)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.False(t, cs.Next(cctx))
	requireCode(t, cs.Err(), 280, "ChangeStreamFatalError")
	var se mongo.ServerError
	require.ErrorAs(t, cs.Err(), &se)
	require.True(t, se.HasErrorLabel("NonResumableChangeStreamError"), "%v", cs.Err())
}

func testTruncatedAndDisambiguated(t *testing.T, env EnvFunc) {
	_, db, ctx := setup(t, env)
	coll := createColl(t, ctx, db, "c")
	insert(t, ctx, coll, `[{"_id":1,"arr":["a",{"x":1},1,2],"m":{"1":1}}]`)
	plain := watch(t, ctx, coll, nil)
	expanded := watch(t, ctx, coll, nil, options.ChangeStream().SetShowExpandedEvents(true))
	_, err := coll.UpdateOne(ctx, D(`{"_id":1}`), Ds(`[{"$set":{"arr":["a",{"x":1}]}}]`))
	require.NoError(t, err)
	_, err = coll.UpdateOne(ctx, D(`{"_id":1}`), D(`{"$set":{"m.1":2}}`))
	require.NoError(t, err)
	evs := nextEvents(t, plain, 2)
	requireField(t, evs[0], "updateDescription", `{"updatedFields":{},"removedFields":[],"truncatedArrays":[{"field":"arr","newSize":2}]}`)
	requireField(t, evs[1], "updateDescription", `{"updatedFields":{"m.1":2},"removedFields":[],"truncatedArrays":[]}`)
	evs = nextEvents(t, expanded, 2)
	ud, _ := get(evs[1], "updateDescription").(bson.D)
	requireField(t, ud, "disambiguatedPaths", `{"m.1":["m","1"]}`)
}
