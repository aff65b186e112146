"""podbay.testing"""
