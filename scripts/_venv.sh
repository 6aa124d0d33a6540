# Sourced by scripts/run and scripts/test: make sure .venv exists and holds the
# project installed (editable) with the extras named in $1 (comma separated).
# Re-installs only when pyproject.toml or the extras changed, so a second run is fast.
set -euo pipefail

# Spark (the pipeline's tests) needs a Java runtime, 17 or newer; install one if there is none.
ensure_java() {
    if command -v java >/dev/null 2>&1; then
        return
    fi
    echo "no java found: installing openjdk-17-jre-headless (Spark needs Java 17+)" >&2
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -q >&2 && apt-get install -y -q openjdk-17-jre-headless >&2
    else
        echo "error: install a Java 17+ runtime (e.g. apt-get install openjdk-17-jre-headless)" >&2
        exit 1
    fi
}

# The partition tests put members in network namespaces with iproute2's "ip" (as root); install
# it when missing and we can. Without it (or without root) those tests are skipped and say why.
ensure_iproute2() {
    if command -v ip >/dev/null 2>&1 || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        return
    fi
    echo "no 'ip' found: installing iproute2 (the partition tests need it)" >&2
    apt-get update -q >&2 && apt-get install -y -q iproute2 >&2 || echo "warning: iproute2 not installed" >&2
}

# The isolation tests drop a member's address with nftables ("nft"), as root; install it when
# missing and we can. Without it those tests are skipped and say why.
ensure_nftables() {
    if command -v nft >/dev/null 2>&1 || [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        return
    fi
    echo "no 'nft' found: installing nftables (the isolation tests need it)" >&2
    apt-get update -q >&2 && apt-get install -y -q nftables >&2 || echo "warning: nftables not installed" >&2
}

ensure_venv() {
    local extras="$1"
    # The test suite includes the data pipeline's tests: installing for tests means Spark too.
    case ",$extras," in
        *,dev,*) case ",$extras," in *,spark,*) ;; *) extras="$extras,spark" ;; esac ;;
    esac
    case ",$extras," in *,spark,*) ensure_java ;; esac
    case ",$extras," in *,dev,*) ensure_iproute2; ensure_nftables ;; esac
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    local py="${PYTHON:-python3}"
    if ! command -v "$py" >/dev/null 2>&1; then
        echo "error: $py not found; install Python 3.11 or newer" >&2
        exit 1
    fi
    if ! "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
        echo "error: Python 3.11 or newer is needed ($("$py" --version 2>&1) found)" >&2
        exit 1
    fi
    if [ ! -x "$root/.venv/bin/python" ]; then
        echo "creating virtualenv in .venv" >&2
        "$py" -m venv "$root/.venv"
        "$root/.venv/bin/python" -m pip install -q --upgrade pip >&2
    fi
    local stamp="$root/.venv/.installed-$(echo "$extras" | tr ',' '-')"
    local want
    want="$(sha1sum "$root/pyproject.toml" | cut -d' ' -f1)"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        echo "installing the project with extras [$extras]" >&2
        "$root/.venv/bin/python" -m pip install -q -e "$root[$extras]" >&2
        echo "$want" > "$stamp"
    fi
}
