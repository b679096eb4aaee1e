package mongofake

import (
	"fmt"
	"math"
	"net"
	"os"
	"runtime"
	"sort"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// serverVersion is the MongoDB version the server claims; it matches
// maxWireVersion 21.
const serverVersion = "7.0.0"

func init() {
	register(
		commandSpec{names: []string{"buildInfo", "buildinfo"}, handler: buildInfo, noSession: true},
		commandSpec{names: []string{"ping"}, handler: ping, noSession: true},
		commandSpec{names: []string{"getParameter"}, handler: getParameter, adminOnly: true, noSession: true},
		commandSpec{names: []string{"setParameter"}, handler: setParameter, adminOnly: true, noSession: true},
		commandSpec{names: []string{"getCmdLineOpts"}, handler: getCmdLineOpts, adminOnly: true, noSession: true},
		commandSpec{names: []string{"hostInfo"}, handler: hostInfo, noSession: true},
		commandSpec{names: []string{"serverStatus"}, handler: serverStatus, noSession: true},
		commandSpec{names: []string{"connectionStatus"}, handler: connectionStatus, noSession: true},
		commandSpec{names: []string{"whatsmyuri"}, handler: whatsmyuri, noSession: true},
		commandSpec{names: []string{"getLog"}, handler: getLog, adminOnly: true, noSession: true},
		commandSpec{names: []string{"replSetGetStatus"}, handler: replSetGetStatus, adminOnly: true, noSession: true},
		commandSpec{names: []string{"replSetGetConfig"}, handler: replSetGetConfig, adminOnly: true, noSession: true},
		commandSpec{names: []string{"listCommands"}, handler: listCommands, noSession: true},
		commandSpec{names: []string{"getFreeMonitoringStatus"}, handler: getFreeMonitoringStatus, adminOnly: true, noSession: true},
		commandSpec{names: []string{"getDefaultRWConcern"}, handler: getDefaultRWConcern, adminOnly: true, noSession: true},
		commandSpec{names: []string{"saslStart", "saslContinue", "authenticate", "getnonce"}, handler: authUnsupported, noSession: true},
		commandSpec{names: []string{"logout"}, handler: ping, noSession: true},
		commandSpec{names: []string{
			"createUser", "updateUser", "dropUser", "dropAllUsersFromDatabase", "usersInfo",
			"grantRolesToUser", "revokeRolesFromUser", "createRole", "updateRole", "dropRole",
			"dropAllRolesFromDatabase", "rolesInfo", "grantRolesToRole", "revokeRolesFromRole",
			"grantPrivilegesToRole", "revokePrivilegesFromRole",
		}, handler: userManagementUnsupported},
	)
}

func ping(*request) (bson.D, error) { return bson.D{}, nil }

func buildInfo(*request) (bson.D, error) {
	return bson.D{
		{Key: "version", Value: serverVersion},
		{Key: "gitVersion", Value: "mongofake"},
		{Key: "modules", Value: bson.A{}},
		{Key: "allocator", Value: "system"},
		{Key: "javascriptEngine", Value: "none"},
		{Key: "sysInfo", Value: "deprecated"},
		{Key: "versionArray", Value: bson.A{int32(7), int32(0), int32(0), int32(0)}},
		{Key: "openssl", Value: bson.D{{Key: "running", Value: "disabled"}, {Key: "compiled", Value: "disabled"}}},
		{Key: "buildEnvironment", Value: bson.D{
			{Key: "target_os", Value: runtime.GOOS},
			{Key: "target_arch", Value: runtime.GOARCH},
			{Key: "distmod", Value: "mongofake"},
		}},
		{Key: "bits", Value: int32(64)},
		{Key: "debug", Value: false},
		{Key: "maxBsonObjectSize", Value: int32(maxBSONObjectSize)},
		{Key: "storageEngines", Value: bson.A{"mongofake"}},
	}, nil
}

// wholeSeconds renders a duration as a parameter in seconds (at least 1
// when positive, as a sub-second test setting cannot be shown otherwise).
func wholeSeconds(d time.Duration) int32 {
	if d <= 0 {
		return 0
	}
	return int32(max(1, (d+time.Second-1)/time.Second))
}

// parameters returns the server parameters getParameter knows.
func (s *Server) parameters() bson.D {
	return bson.D{
		{Key: "authenticationMechanisms", Value: bson.A{}},
		{Key: "enableTestCommands", Value: s.cfg.testCommands},
		{Key: "featureCompatibilityVersion", Value: bson.D{{Key: "version", Value: "7.0"}}},
		{Key: "logLevel", Value: int32(0)},
		{Key: "maxTransactionLockRequestTimeoutMillis", Value: int32(5)},
		{Key: "minSnapshotHistoryWindowInSeconds", Value: max(0, wholeSeconds(s.engine.HistoryWindow()))},
		{Key: "requireApiVersion", Value: false},
		{Key: "transactionLifetimeLimitSeconds", Value: wholeSeconds(s.engine.TransactionLifetime())},
		{Key: "ttlMonitorSleepSecs", Value: wholeSeconds(s.engine.TTLInterval())},
	}
}

// settableParameters are the parameters setParameter changes at run time,
// as mongod does: each takes a whole number of seconds with its minimum.
var settableParameters = map[string]struct {
	min int64
	set func(*Server, time.Duration)
}{
	"transactionLifetimeLimitSeconds":   {1, func(s *Server, d time.Duration) { s.engine.SetTransactionLifetime(d) }},
	"ttlMonitorSleepSecs":               {1, func(s *Server, d time.Duration) { s.engine.SetTTLInterval(d) }},
	"minSnapshotHistoryWindowInSeconds": {0, func(s *Server, d time.Duration) { s.engine.SetHistoryWindow(d) }},
}

// setParameter implements {setParameter: 1, <name>: <value>} for the
// parameters of settableParameters and replies {was: <previous value>}
// (https://www.mongodb.com/docs/v7.0/reference/command/setParameter/).
// transactionLifetimeLimitSeconds applies to the transactions started
// afterwards, ttlMonitorSleepSecs re-arms the TTL monitor at once. Other
// parameters are refused with NotImplemented naming them.
func setParameter(r *request) (bson.D, error) {
	var out bson.D
	found := false
	for _, e := range r.cmd[1:] {
		if genericFields[e.Key] {
			continue
		}
		found = true
		p, ok := settableParameters[e.Key]
		if !ok {
			return nil, errorf(238, "NotImplemented", "mongofake: setParameter "+e.Key+" is not supported; the embedded server sets "+
				"transactionLifetimeLimitSeconds, ttlMonitorSleepSecs and minSnapshotHistoryWindowInSeconds")
		}
		n, ok := wholeNumber(e.Value)
		if !ok {
			return nil, wrongType("setParameter."+e.Key, e.Value, "int")
		}
		if n < p.min || n > math.MaxInt32 {
			return nil, errorf(2, "BadValue", fmt.Sprintf("Invalid value for parameter %s: %d is not greater than or equal to %d", e.Key, n, p.min))
		}
		if out == nil {
			out = bson.D{{Key: "was", Value: lookupD(r.srv.parameters(), e.Key)}}
		}
		p.set(r.srv, time.Duration(n)*time.Second)
	}
	if !found {
		return nil, errorf(72, "InvalidOptions", "no option found to set, use help:true to see options ")
	}
	return out, nil
}

// getParameter implements {getParameter: 1, <name>: 1, ...} and
// {getParameter: "*"} (every parameter), with the {showDetails,
// allParameters} document form.
func getParameter(r *request) (bson.D, error) {
	params := r.srv.parameters()
	all, details := false, false
	switch v := r.cmd[0].Value.(type) {
	case string:
		all = v == "*"
	case bson.D:
		for _, e := range v {
			b, _ := e.Value.(bool)
			switch e.Key {
			case "allParameters":
				all = b
			case "showDetails":
				details = b
			}
		}
	}
	wrap := func(v any) any {
		if !details {
			return v
		}
		return bson.D{{Key: "value", Value: v}, {Key: "settableAtRuntime", Value: false}, {Key: "settableAtStartup", Value: false}}
	}
	var out bson.D
	if all {
		for _, p := range params {
			out = append(out, bson.E{Key: p.Key, Value: wrap(p.Value)})
		}
		return out, nil
	}
	for _, e := range r.cmd[1:] {
		switch e.Key {
		case "$db", "lsid", "$clusterTime", "$readPreference", "comment", "apiVersion", "apiStrict", "apiDeprecationErrors":
			continue
		}
		v := lookupD(params, e.Key)
		if v == nil {
			continue // mongod skips parameters it does not know
		}
		out = append(out, bson.E{Key: e.Key, Value: wrap(v)})
	}
	if len(out) == 0 {
		return nil, errorf(72, "InvalidOptions", "no option found to get")
	}
	return out, nil
}

func getCmdLineOpts(r *request) (bson.D, error) {
	host, port, _ := net.SplitHostPort(r.srv.Addr())
	p, _ := strconv.Atoi(port)
	return bson.D{
		{Key: "argv", Value: bson.A{"mongofake"}},
		{Key: "parsed", Value: bson.D{
			{Key: "net", Value: bson.D{{Key: "bindIp", Value: host}, {Key: "port", Value: int32(p)}}},
			{Key: "replication", Value: bson.D{{Key: "replSet", Value: r.srv.cfg.replSet}}},
			{Key: "setParameter", Value: bson.D{{Key: "enableTestCommands", Value: strconv.FormatBool(r.srv.cfg.testCommands)}}},
		}},
	}, nil
}

func hostInfo(*request) (bson.D, error) {
	hostname, _ := os.Hostname()
	return bson.D{
		{Key: "system", Value: bson.D{
			{Key: "currentTime", Value: bson.NewDateTimeFromTime(time.Now())},
			{Key: "hostname", Value: hostname},
			{Key: "cpuAddrSize", Value: int32(64)},
			{Key: "numCores", Value: int32(runtime.NumCPU())},
			{Key: "cpuArch", Value: runtime.GOARCH},
			{Key: "numaEnabled", Value: false},
		}},
		{Key: "os", Value: bson.D{{Key: "type", Value: runtime.GOOS}, {Key: "name", Value: runtime.GOOS}}},
		{Key: "extra", Value: bson.D{}},
	}, nil
}

func serverStatus(r *request) (bson.D, error) {
	s := r.srv
	hostname, _ := os.Hostname()
	up := time.Since(s.started)
	current := int32(s.ConnectionCount())
	host := s.advertisedHost(r.conn)
	return bson.D{
		{Key: "host", Value: hostname},
		{Key: "version", Value: serverVersion},
		{Key: "process", Value: "mongod"},
		{Key: "pid", Value: int64(os.Getpid())},
		{Key: "uptime", Value: up.Seconds()},
		{Key: "uptimeMillis", Value: up.Milliseconds()},
		{Key: "uptimeEstimate", Value: int64(up.Seconds())},
		{Key: "localTime", Value: bson.NewDateTimeFromTime(time.Now())},
		{Key: "connections", Value: bson.D{
			{Key: "current", Value: current},
			{Key: "available", Value: int32(1_000_000) - current},
			{Key: "totalCreated", Value: s.nextConnID.Load()},
			{Key: "active", Value: current},
		}},
		{Key: "repl", Value: bson.D{
			{Key: "setName", Value: s.cfg.replSet},
			{Key: "setVersion", Value: int32(1)},
			{Key: "isWritablePrimary", Value: true},
			{Key: "secondary", Value: false},
			{Key: "primary", Value: host},
			{Key: "me", Value: host},
			{Key: "hosts", Value: bson.A{host}},
			{Key: "electionId", Value: s.electionID},
		}},
		{Key: "storageEngine", Value: bson.D{
			{Key: "name", Value: "mongofake"},
			{Key: "supportsCommittedReads", Value: true},
			{Key: "persistent", Value: false},
		}},
	}, nil
}

func connectionStatus(r *request) (bson.D, error) {
	info := bson.D{
		{Key: "authenticatedUsers", Value: bson.A{}},
		{Key: "authenticatedUserRoles", Value: bson.A{}},
	}
	if b, _ := lookupD(r.cmd, "showPrivileges").(bool); b {
		info = append(info, bson.E{Key: "authenticatedUserPrivileges", Value: bson.A{}})
	}
	return bson.D{{Key: "authInfo", Value: info}}, nil
}

func whatsmyuri(r *request) (bson.D, error) {
	return bson.D{{Key: "you", Value: r.conn.remote}}, nil
}

func getLog(r *request) (bson.D, error) {
	switch v, _ := r.cmd[0].Value.(string); v {
	case "*":
		return bson.D{{Key: "names", Value: bson.A{"global", "startupWarnings"}}}, nil
	case "global", "startupWarnings":
		return bson.D{{Key: "totalLinesWritten", Value: int32(0)}, {Key: "log", Value: bson.A{}}}, nil
	default:
		return nil, errorf(2, "BadValue", "getLog: no RamLog named '"+v+"'; use \"*\", \"global\" or \"startupWarnings\"")
	}
}

func replSetGetStatus(r *request) (bson.D, error) {
	s := r.srv
	host := s.advertisedHost(r.conn)
	ts := s.engine.ClusterTime()
	opTime := bson.D{{Key: "ts", Value: ts}, {Key: "t", Value: int64(1)}}
	now := bson.NewDateTimeFromTime(time.Now())
	started := bson.NewDateTimeFromTime(s.started)
	return bson.D{
		{Key: "set", Value: s.cfg.replSet},
		{Key: "date", Value: now},
		{Key: "myState", Value: int32(1)},
		{Key: "term", Value: int64(1)},
		{Key: "heartbeatIntervalMillis", Value: int64(2000)},
		{Key: "majorityVoteCount", Value: int32(1)},
		{Key: "writeMajorityCount", Value: int32(1)},
		{Key: "votingMembersCount", Value: int32(1)},
		{Key: "writableVotingMembersCount", Value: int32(1)},
		{Key: "optimes", Value: bson.D{
			{Key: "lastCommittedOpTime", Value: opTime},
			{Key: "appliedOpTime", Value: opTime},
			{Key: "durableOpTime", Value: opTime},
		}},
		{Key: "members", Value: bson.A{bson.D{
			{Key: "_id", Value: int32(0)},
			{Key: "name", Value: host},
			{Key: "health", Value: 1.0},
			{Key: "state", Value: int32(1)},
			{Key: "stateStr", Value: "PRIMARY"},
			{Key: "uptime", Value: int32(time.Since(s.started).Seconds())},
			{Key: "optime", Value: opTime},
			{Key: "optimeDate", Value: bson.NewDateTimeFromTime(time.Unix(int64(ts.T), 0))},
			{Key: "electionTime", Value: bson.Timestamp{T: uint32(s.started.Unix()), I: 1}},
			{Key: "electionDate", Value: started},
			{Key: "configVersion", Value: int32(1)},
			{Key: "configTerm", Value: int32(1)},
			{Key: "self", Value: true},
		}}},
	}, nil
}

func replSetGetConfig(r *request) (bson.D, error) {
	s := r.srv
	return bson.D{{Key: "config", Value: bson.D{
		{Key: "_id", Value: s.cfg.replSet},
		{Key: "version", Value: int32(1)},
		{Key: "term", Value: int32(1)},
		{Key: "members", Value: bson.A{bson.D{
			{Key: "_id", Value: int32(0)},
			{Key: "host", Value: s.advertisedHost(r.conn)},
			{Key: "arbiterOnly", Value: false},
			{Key: "buildIndexes", Value: true},
			{Key: "hidden", Value: false},
			{Key: "priority", Value: 1.0},
			{Key: "tags", Value: bson.D{}},
			{Key: "secondaryDelaySecs", Value: int64(0)},
			{Key: "votes", Value: int32(1)},
		}}},
		{Key: "protocolVersion", Value: int64(1)},
		{Key: "settings", Value: bson.D{}},
	}}}, nil
}

func listCommands(r *request) (bson.D, error) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	cmds := make(bson.D, 0, len(names))
	for _, n := range names {
		if commands[n].testOnly && !r.srv.cfg.testCommands {
			continue
		}
		versions, deprecated := apiVersionsOf(n, commands[n])
		cmds = append(cmds, bson.E{Key: n, Value: bson.D{
			{Key: "help", Value: ""},
			{Key: "requiresAuth", Value: false},
			{Key: "secondaryOk", Value: true},
			{Key: "adminOnly", Value: commands[n].adminOnly},
			{Key: "apiVersions", Value: stringsToA(versions)},
			{Key: "deprecatedApiVersions", Value: stringsToA(deprecated)},
		}})
	}
	return bson.D{{Key: "commands", Value: cmds}}, nil
}

func getFreeMonitoringStatus(*request) (bson.D, error) {
	return bson.D{{Key: "state", Value: "disabled"}}, nil
}

func getDefaultRWConcern(*request) (bson.D, error) {
	return bson.D{
		{Key: "defaultReadConcern", Value: bson.D{{Key: "level", Value: "local"}}},
		{Key: "defaultWriteConcern", Value: bson.D{{Key: "w", Value: "majority"}, {Key: "wtimeout", Value: int32(0)}}},
		{Key: "defaultWriteConcernSource", Value: "implicit"},
		{Key: "defaultReadConcernSource", Value: "implicit"},
	}, nil
}

// userManagementUnsupported answers the user and role management commands:
// they are mongod commands (so fail points and the Stable API apply to
// them), but the embedded server keeps no users.
func userManagementUnsupported(r *request) (bson.D, error) {
	return nil, errorf(238, "NotImplemented",
		"mongofake: "+r.name+" is not supported: the embedded server has no users or roles (no authentication)")
}

func authUnsupported(r *request) (bson.D, error) {
	return nil, errorf(18, "AuthenticationFailed",
		"mongofake: "+r.name+" failed: the embedded server has no authentication; connect without credentials")
}
