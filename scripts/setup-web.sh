#!/usr/bin/env bash
# The browser edge target (`tinyt package --format web`, tests/export/test_web*.py): onnxruntime-web
# and @huggingface/tokenizers (the page's tokenizer) at the versions web/package-lock.json pins,
# from the npm registry, into web/node_modules; and a
# Chromium for the headless page tests, from the distribution's packages (Debian: chromium).
# Playwright (the `web` extra) drives that system browser; it downloads no browser of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v node >/dev/null && command -v npm >/dev/null || {
  echo "setup-web: node and npm are needed (Debian: apt-get install nodejs npm)" >&2; exit 2; }
(cd web && npm ci --no-audit --no-fund --loglevel=error)
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "setup-web: no chromium; install the distribution's package (apt-get install chromium)" \
         "as root — the browser tests skip without it" >&2
  fi
fi
version() { node -p "require('./web/node_modules/$1/package.json').version"; }
echo "onnxruntime-web $(version onnxruntime-web)," \
     "@huggingface/tokenizers $(version @huggingface/tokenizers)," \
     "$(command -v chromium || command -v chromium-browser || echo 'no chromium')"
