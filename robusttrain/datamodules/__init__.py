"""robusttrain.datamodules"""
