# Sourced by the study scripts: the compact, committed copy of a study's SQLite store.
#   compact_store DB GZ   a consistent snapshot of DB (SQLite's online backup: safe while a study is still writing
#                         to it, e.g. to commit a study that spans sessions), VACUUMed (runs, params, metrics, tags;
#                         artifacts live elsewhere), gzipped without a timestamp (-n) to GZ
compact_store() {
  python -c "import sqlite3, sys; s = sqlite3.connect(f'file:{sys.argv[1]}?mode=ro', uri=True); d = sqlite3.connect(sys.argv[2]); s.backup(d); s.close(); d.execute('VACUUM'); d.close()" \
    "$1" "$1.compact" && gzip -9 -n -c "$1.compact" > "$2" && rm "$1.compact"
}
#   continue_stores DIR GZ OPTUNA_GZ   a study that spans sessions (or machines) continues from the committed stores
#                         when DIR has none, and they are compacted back into GZ and OPTUNA_GZ on every exit (what
#                         ran is kept, even when the study is stopped)
continue_stores() {
  [[ -f "$1/mlflow.db" || ! -f "$2" ]] || gunzip -c "$2" > "$1/mlflow.db"
  [[ -f "$1/optuna.db" || ! -f "$3" ]] || gunzip -c "$3" > "$1/optuna.db"
  trap "compact_store '$1/mlflow.db' '$2'; compact_store '$1/optuna.db' '$3'" EXIT
}
