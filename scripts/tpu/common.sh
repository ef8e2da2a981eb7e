# Shell helpers shared by the scripts in scripts/tpu/ (sourced, not run).

# One command as a shell line: words with characters the shell would read are single-quoted.
show() {
  local out=() word
  for word in "$@"; do
    if [[ $word =~ ^[][A-Za-z0-9_./:=@%+,-]+$ ]]; then out+=("$word"); else out+=("'${word//\'/\'\\\'\'}'"); fi
  done
  echo "${out[*]}"
}

# Runs a command, echoing it to stderr first; with dry_run set, prints it (stdout) instead.
run() {
  if [ -n "${dry_run:-}" ]; then
    show "$@"
  else
    echo "+ $(show "$@")" >&2
    "$@"
  fi
}
