# Sourced by the study scripts: the compact, committed copy of a study's SQLite store.
#   compact_store DB GZ   a consistent snapshot of DB (SQLite's online backup: safe while a study is still writing
#                         to it, e.g. to commit a study that spans sessions), VACUUMed (runs, params, metrics, tags;
#                         artifacts live elsewhere), gzipped without a timestamp (-n) to GZ
compact_store() {
  python -c "import sqlite3, sys; s = sqlite3.connect(f'file:{sys.argv[1]}?mode=ro', uri=True); d = sqlite3.connect(sys.argv[2]); s.backup(d); s.close(); d.execute('VACUUM'); d.close()" \
    "$1" "$1.compact" && gzip -9 -n -c "$1.compact" > "$2" && rm "$1.compact"
}
