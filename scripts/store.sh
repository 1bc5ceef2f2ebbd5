# Sourced by the study scripts: the compact, committed copy of a study's SQLite store.
#   compact_store DB GZ   VACUUMed copy of DB (runs, params, metrics, tags; artifacts live elsewhere), gzipped
#                         without a timestamp (-n: the same store gives the same bytes) to GZ
compact_store() {
  python -c "import shutil, sqlite3, sys; shutil.copy(sys.argv[1], sys.argv[2]); c = sqlite3.connect(sys.argv[2]); c.execute('VACUUM'); c.close()" \
    "$1" "$1.compact" && gzip -9 -n -c "$1.compact" > "$2" && rm "$1.compact"
}
