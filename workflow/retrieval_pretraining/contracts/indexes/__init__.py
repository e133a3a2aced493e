"""The index contract: BM25 Lucene folders (results/bm25/{dataset}/index/, bm25.py) and dense
FAISS folders in Pyserini's FaissSearcher layout (`index` + `docid`, one id line per vector;
faiss_index.py). A file inside either folder is audited as part of its folder.
"""
