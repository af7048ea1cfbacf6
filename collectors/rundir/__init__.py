"""The run folder's writers: the event writer, repartition, output-folder checks, the E0 archive import, the declared model shape."""
