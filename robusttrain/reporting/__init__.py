"""robusttrain.reporting"""
