# bash completion for dtrain, made by `dtrain completion bash`.
# Do not edit by hand: scripts/completion/dtrain.bash is a copy that test_cli compares with
# the command's output.
# Install: dtrain completion bash > /etc/bash_completion.d/dtrain
#      or: source <(dtrain completion bash)

# Adds the words of a newline-separated list to COMPREPLY, each once.
_dtrain_add() {
  local word seen
  while IFS= read -r word; do
    [[ -z $word ]] && continue
    for seen in "${COMPREPLY[@]}"; do
      [[ $seen == "$word" ]] && continue 2
    done
    COMPREPLY+=("$word")
  done <<< "$1"
}

# Job files (*.json) and directories that start with $1.
_dtrain_job_files() {
  _dtrain_add "$(compgen -f -X '!*.json' -- "$1")"
  _dtrain_add "$(compgen -d -- "$1")"
  compopt -o filenames 2> /dev/null
}

# Run directories under ./runs that start with $1, then job files and directories.
_dtrain_runs() {
  local dir
  for dir in runs/*/; do
    [[ -d $dir && ${dir%/} == "$1"* ]] && _dtrain_add "${dir%/}"
  done
  _dtrain_job_files "$1"
}

_dtrain() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=""
  local opts="" value_opts="" dir_opts="" operand=none
  COMPREPLY=()
  (( COMP_CWORD > 0 )) && prev=${COMP_WORDS[COMP_CWORD - 1]}
  if (( COMP_CWORD == 1 )); then
    _dtrain_add "$(compgen -W "launch logs status stop evaluate predict generate validate tf-config slurm-script completion agent --help --version" -- "$cur")"
    return 0
  fi
  case ${COMP_WORDS[1]} in
    launch)
      opts="-h --help --run-dir --detach --metrics-port --dry-run --fresh"
      value_opts="--metrics-port"
      dir_opts="--run-dir"
      operand=job
      ;;
    logs)
      opts="-h --help -f --follow --worker --task -n --lines --raw --since --grep"
      value_opts="--worker --task -n --lines --since --grep"
      dir_opts=""
      operand=run
      ;;
    status)
      opts="-h --help --json"
      value_opts=""
      dir_opts=""
      operand=run
      ;;
    stop)
      opts="-h --help --now --timeout"
      value_opts="--timeout"
      dir_opts=""
      operand=run
      ;;
    evaluate)
      opts="-h --help --data --labels --json"
      value_opts="--data --labels"
      dir_opts=""
      operand=run
      ;;
    predict)
      opts="-h --help --input --output"
      value_opts="--input --output"
      dir_opts=""
      operand=run
      ;;
    generate)
      opts="-h --help --prompt --tokens --temperature --top-k --seed"
      value_opts="--prompt --tokens --temperature --top-k --seed"
      dir_opts=""
      operand=run
      ;;
    validate)
      opts="-h --help"
      value_opts=""
      dir_opts=""
      operand=job
      ;;
    tf-config)
      opts="-h --help --task"
      value_opts="--task"
      dir_opts=""
      operand=job
      ;;
    slurm-script)
      opts="-h --help"
      value_opts=""
      dir_opts=""
      operand=job
      ;;
    completion)
      opts="-h --help"
      value_opts=""
      dir_opts=""
      operand=shell
      ;;
    agent)
      opts="-h --help --request-timeout --keepalive --signal-grace"
      value_opts="--request-timeout --keepalive --signal-grace"
      dir_opts=""
      operand=none
      ;;
    *)
      return 0
      ;;
  esac
  if [[ " $dir_opts " == *" $prev "* ]]; then
    _dtrain_add "$(compgen -d -- "$cur")"
    compopt -o filenames 2> /dev/null
    return 0
  fi
  [[ " $value_opts " == *" $prev "* ]] && return 0
  if [[ $cur == -* ]]; then
    _dtrain_add "$(compgen -W "$opts" -- "$cur")"
    return 0
  fi
  case $operand in
    job) _dtrain_job_files "$cur" ;;
    run) _dtrain_runs "$cur" ;;
    shell) _dtrain_add "$(compgen -W "bash" -- "$cur")" ;;
  esac
  return 0
}

complete -F _dtrain dtrain
