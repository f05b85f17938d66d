"""File names of the cluster artifacts: shared by the build and the SGLang processor,
which must import without the rest of compressor_2's dependencies."""

EMBEDDINGS_FILE = "embeddings.npy"
EMBEDDINGS_KEY_FILE = "embeddings.fingerprint"
PCA_FILE = "pca.joblib"
KMEANS_FILE = "labels_kmeans.joblib"
TOKEN_CLUSTERS_FILE = "token_clusters.npy"
# Written last by a build, removed first by a rebuild: present = a complete set.
BUILD_RECORD_FILE = "fingerprint.json"
LEDGER_FILE = "written.json"  # what builds wrote outside their own names (clusters/builder/written.py)
CLUSTER_LOCK_FILE = ".lock"  # held shared by every process using the set, exclusively by a rebuild
# The cluster map's id of a token no delta may move (a special or added token other than
# EOS): it is in no cluster, and its bias is 0 whatever the deltas.
UNSTEERED = -1
