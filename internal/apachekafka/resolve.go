package apachekafka

import (
	"bufio"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Version is the pinned Apache Kafka release whose broker jars (the Maven
// artifact org.apache.kafka:kafka_2.13 and its dependencies) this package
// runs. pom.xml names the same version.
const Version = "4.4.0"

// Log4jVersion is the pinned log4j2 release that gives the broker a
// logging backend (log4j-slf4j-impl and log4j-core). pom.xml names the
// same version.
const Log4jVersion = "2.26.1"

// EnvCacheDir names the environment variable that overrides the cache
// directory of the resolved jars (see [CacheDir]).
const EnvCacheDir = "OUTBOX_KAFKA_CACHE"

// InstallHint tells a person how to get what the real broker needs on a
// Debian or Ubuntu machine.
const InstallHint = "install Java 17+ and Maven (Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless maven)"

//go:embed pom.xml
var pom []byte

// ErrMissingTool reports that java or mvn is not installed. The error's
// text names the missing command and [InstallHint].
var ErrMissingTool = errors.New("apachekafka: missing tool")

// ErrResolve reports that Maven could not fetch the jars (no network, no
// Maven Central, or a release it does not serve).
var ErrResolve = errors.New("apachekafka: resolving the jars failed")

// markerName is the file written in the cache directory once every jar of
// a resolution is in place; it lists the jars, one a line.
const markerName = "complete"

// CacheDir returns the directory holding the resolved jars of [Version]:
// $OUTBOX_KAFKA_CACHE/<Version> when that variable is set, else
// <user cache dir>/outbox-kafka/<Version> ($XDG_CACHE_HOME or ~/.cache on
// Linux).
func CacheDir() (string, error) {
	if d := os.Getenv(EnvCacheDir); d != "" {
		return filepath.Join(d, Version), nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("apachekafka: no cache directory (set %s): %w", EnvCacheDir, err)
	}
	return filepath.Join(base, "outbox-kafka", Version), nil
}

// javaPath returns the java command: $JAVA_HOME/bin/java when JAVA_HOME is
// set, else java from PATH.
func javaPath() (string, error) {
	if home := os.Getenv("JAVA_HOME"); home != "" {
		p := filepath.Join(home, "bin", "java")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("java")
	if err != nil {
		return "", fmt.Errorf("%w: java not found: %s", ErrMissingTool, InstallHint)
	}
	return p, nil
}

// Resolved reports whether the jars of [Version] are complete in cacheDir,
// so that [Resolve] would start no Maven.
func Resolved(cacheDir string) bool {
	_, err := completeJars(cacheDir)
	return err == nil
}

// completeJars returns the jar directory of cacheDir when its marker lists
// jars that are all present.
func completeJars(cacheDir string) (string, error) {
	lib := filepath.Join(cacheDir, "lib")
	list, err := os.ReadFile(filepath.Join(cacheDir, markerName))
	if err != nil {
		return "", err
	}
	n := 0
	for _, name := range strings.Fields(string(list)) {
		if _, err := os.Stat(filepath.Join(lib, name)); err != nil {
			return "", err
		}
		n++
	}
	if n == 0 {
		return "", fmt.Errorf("apachekafka: empty marker in %s", cacheDir)
	}
	return lib, nil
}

// Resolve returns the directory of the broker's jars in cacheDir. When the
// cache is complete it returns at once, without Maven or the network;
// otherwise it runs `mvn dependency:copy-dependencies` on the embedded
// pom.xml, printing progress (one line a downloaded jar) to progress, and
// marks the cache complete only after Maven succeeded. Concurrent callers,
// in this process or others, are serialised by a lock file in cacheDir.
func Resolve(ctx context.Context, cacheDir string, progress io.Writer) (string, error) {
	if lib, err := completeJars(cacheDir); err == nil {
		return lib, nil
	}
	if progress == nil {
		progress = io.Discard
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", fmt.Errorf("apachekafka: cache directory: %w", err)
	}
	unlock, err := lockDir(ctx, cacheDir)
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have finished while this one waited for the lock.
	if lib, err := completeJars(cacheDir); err == nil {
		return lib, nil
	}
	mvn, err := exec.LookPath("mvn")
	if err != nil {
		return "", fmt.Errorf("%w: mvn not found, needed once to fetch Apache Kafka %s into %s: %s", ErrMissingTool, Version, cacheDir, InstallHint)
	}
	pomPath := filepath.Join(cacheDir, "pom.xml")
	if err := os.WriteFile(pomPath, pom, 0o644); err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	tmp := filepath.Join(cacheDir, "lib.partial")
	if err := os.RemoveAll(tmp); err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	fmt.Fprintf(progress, "apachekafka: resolving Apache Kafka %s (log4j %s) with Maven into %s (first start only; later starts are offline)\n", Version, Log4jVersion, cacheDir)
	cmd := exec.CommandContext(ctx, mvn, "-B", "-f", pomPath,
		"dependency:copy-dependencies", "-DincludeScope=runtime", "-DoutputDirectory="+tmp)
	cmd.Dir = cacheDir
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("apachekafka: start mvn: %w", err)
	}
	var tail []string // the last lines, for the error
	jars := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		tail = append(tail, line)
		if len(tail) > 30 {
			tail = tail[1:]
		}
		if name, ok := downloadedJar(line); ok {
			jars++
			fmt.Fprintf(progress, "apachekafka: [%d] %s\n", jars, name)
		}
	}
	if err := cmd.Wait(); err != nil {
		return "", fmt.Errorf("%w: mvn: %v; last output:\n%s", ErrResolve, err, strings.Join(tail, "\n"))
	}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".jar") {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		return "", fmt.Errorf("apachekafka: mvn copied no jar into %s", tmp)
	}
	lib := filepath.Join(cacheDir, "lib")
	if err := os.RemoveAll(lib); err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	if err := os.Rename(tmp, lib); err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	// The marker goes last: a resolution cut short leaves no marker, and the
	// next start resolves again.
	if err := os.WriteFile(filepath.Join(cacheDir, markerName), []byte(strings.Join(names, "\n")+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("apachekafka: %w", err)
	}
	fmt.Fprintf(progress, "apachekafka: %d jars in %s\n", len(names), lib)
	return lib, nil
}

// downloadedJar returns the file name and size of the jar of a Maven line
// "Downloaded from <repo>: <url>/<name>.jar (<size> at <rate>)".
func downloadedJar(line string) (string, bool) {
	_, after, ok := strings.Cut(line, "Downloaded from ")
	if !ok {
		return "", false
	}
	_, url, _ := strings.Cut(after, ": ")
	url, size, _ := strings.Cut(url, " (")
	if !strings.HasSuffix(url, ".jar") {
		return "", false
	}
	name := url[strings.LastIndex(url, "/")+1:]
	if size, _, ok := strings.Cut(size, " at "); ok {
		name += " (" + size + ")"
	}
	return name, true
}
